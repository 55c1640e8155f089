"""What a rank sees of its host, for tests/real/test_forkserver.py: ``python -m tests.real.forked_probe OUT MODE``.

Writes OUT (JSON): its network interfaces as sysfs lists them and as the kernel reports them, what its
hostname resolves to, the /etc files a testbed host has its own of, its environment's SYNCSIM_PROBE, its
working folder, argv and whether it leads its own session. MODE then decides how it ends: ``ok``
returns, ``exit3`` raises SystemExit(3), ``raise`` raises an exception, ``sleep`` sleeps for a minute;
``allreduce`` joins torch's env:// rendezvous and all-reduces rank + 1 (written to OUT.sum), and
``allreduce-fail1`` does so but rank 1 exits with 3 before joining, leaving rank 0 waiting for it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    if mode.startswith("allreduce"):
        return all_reduce(out, mode)
    seen = {
        "sysfs": sorted(os.listdir("/sys/class/net")),
        "interfaces": sorted(name for _, name in socket.if_nameindex()),
        "hostname": sorted({info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}),
        "hosts": open("/etc/hosts").read(),
        "resolv": open("/etc/resolv.conf").read(),
        "env": os.environ.get("SYNCSIM_PROBE"),
        "cwd": os.getcwd(),
        "argv": sys.argv[1:],
        "session_leader": os.getsid(0) == os.getpid(),
        "pid": os.getpid(),
    }
    with open(out, "w") as f:
        json.dump(seen, f)
    print("probe written")
    if mode == "exit3":
        sys.exit(3)
    if mode == "raise":
        raise RuntimeError("the probe was asked to fail")
    if mode == "sleep":
        time.sleep(60)


def all_reduce(out: str, mode: str) -> None:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if mode == "allreduce-fail1" and rank == 1:
        sys.exit(3)  # before joining: rank 0 waits at the rendezvous until it is stopped
    dist.init_process_group("gloo")
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    with open(f"{out}.sum{rank}", "w") as f:
        f.write(str(total.item()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
