"""The run configurations the distributed tests share (each is launched once per session)."""

ALLREDUCE = ("--scheme", "allreduce:bucket_bytes=64KiB", "--world", "2", "--model", "lenet", "--steps", "4",
             "--batch-size", "16", "--save-params", "--record-checksums")
PS_SYNC = ("--scheme", "ps", "--world", "2", "--servers", "1", "--model", "mlp", "--steps", "4",
           "--batch-size", "16", "--record-checksums", "--save-params")
SSP = ("--scheme", "ps:staleness=1", "--world", "3", "--servers", "1", "--model", "mlp", "--steps", "8",
       "--batch-size", "16", "--slow", "2:40", "--save-params")
ASYNC = ("--scheme", "ps:mode=async", "--world", "2", "--servers", "1", "--model", "mlp", "--steps", "8",
         "--batch-size", "16", "--slow", "1:4", "--save-params")
LOCAL = ("--scheme", "localsgd:period=3,warmup_steps=1,precision=bf16", "--world", "2", "--model", "mlp",
         "--steps", "7", "--batch-size", "16", "--record-checksums", "--save-params")
# references only (tests/real/test_references.py)
ASYNC_ONE = ("--scheme", "ps:mode=async", "--world", "1", "--servers", "1", "--model", "mlp", "--steps", "6",
             "--batch-size", "16", "--save-params")
LOCAL_ONE = ("--scheme", "localsgd:period=1", "--world", "2", "--model", "mlp", "--steps", "4",
             "--batch-size", "16", "--save-params")
FP16 = ("--scheme", "allreduce:precision=fp16", "--world", "2", "--model", "mlp", "--steps", "4",
        "--batch-size", "16", "--save-params")


def option(args: tuple, name: str, default=None):
    return args[args.index(name) + 1] if name in args else default
