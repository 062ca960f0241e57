"""What the Python tests share: the CLI of the same build, checkpoints it writes, an FNV-1a
checksum as `nvfp4moe run` prints it, and a float64 numpy reference of a W4A16 layer."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def cli_path() -> str:
    """The nvfp4moe tool built with the library under test: $NVFP4MOE_CLI, else beside the library."""
    if os.environ.get("NVFP4MOE_CLI"):
        return os.environ["NVFP4MOE_CLI"]
    lib = os.environ.get("NVFP4MOE_LIBRARY")
    if lib:
        cand = Path(lib).resolve().parent / "nvfp4moe"
        if cand.is_file():
            return str(cand)
    return str(ROOT / "build" / "nvfp4moe")


def cli(*args, check=True):
    r = subprocess.run([cli_path(), *map(str, args)], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"nvfp4moe {' '.join(map(str, args))} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


_tmp = None
_ckpts = {}


def tmpdir() -> Path:
    """One scratch directory for the whole run, removed at exit."""
    global _tmp
    if _tmp is None:
        _tmp = Path(tempfile.mkdtemp(prefix="nvfp4moe-py-"))
        import atexit
        atexit.register(shutil.rmtree, _tmp, True)
    return _tmp


def checkpoint(random_flags=(), convert_flags=()) -> str:
    """An NVFP4 checkpoint the CLI writes: `quantize --random RANDOM_FLAGS` (the layer's shape),
    then `quantize --in ... CONVERT_FLAGS` (--format, --w4a16). Made once per run."""
    key = (tuple(random_flags), tuple(convert_flags))
    if key in _ckpts:
        return _ckpts[key]
    d = tmpdir() / f"ckpt{len(_ckpts)}"
    cli("quantize", "--random", "--out", f"{d}-bf16", *random_flags)
    cli("quantize", "--in", f"{d}-bf16", "--out", d, *convert_flags)
    _ckpts[key] = str(d)
    return str(d)


def fnv1a(data: bytes) -> str:
    """The checksum `nvfp4moe run` prints (fnv1a=...)."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def cli_run_checksum(model: str, hidden_f32, *flags) -> str:
    """`nvfp4moe run --model MODEL --input x.f32 FLAGS`'s output checksum (the C API's forward,
    router logits from the checkpoint's router)."""
    path = tmpdir() / "hidden.f32"
    hidden_f32.astype("<f4").tofile(path)
    r = cli("run", "--model", model, "--input", path, *flags)
    for line in r.stdout.splitlines():
        if line.startswith("checksum"):
            return line.split("fnv1a=")[1].strip()
    raise AssertionError(f"no checksum in:\n{r.stdout}")


def need_numpy():
    """numpy, which `make deps` installs (Debian's python3-numpy); NVFP4MOE_SKIP_NUMPY=1 skips the
    tests that need it on a machine without it."""
    try:
        import numpy
        return numpy
    except ImportError:
        import unittest
        if os.environ.get("NVFP4MOE_SKIP_NUMPY") == "1":
            raise unittest.SkipTest("NVFP4MOE_SKIP_NUMPY=1: numpy tests skipped")
        raise AssertionError(f"numpy is missing for {sys.executable} (Debian: python3-numpy; `make deps` installs it; "
                             "NVFP4MOE_SKIP_NUMPY=1 skips these tests)")


# ---- a float64 reference of a W4A16 layer (E2M1 and E4M3 decoded here, independently of C) ----

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_decode(np, codes):
    mag = np.array(E2M1)[codes & 7]
    return np.where(codes & 8, -mag, mag)


def e4m3_decode(np, codes):
    codes = codes.astype(np.int64)
    e = (codes >> 3) & 15
    m = codes & 7
    val = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    val = np.where((e == 15) & (m == 7), np.nan, val)
    return np.where(codes & 0x80, -val, val)


def dequant(np, packed, scales, scale_2):
    """[E, N, K/2] packed, [E, N, K/16] scales, [E] scale_2 -> float64 [E, N, K]."""
    lo = packed & 15
    hi = packed >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(packed.shape[0], packed.shape[1], -1)
    vals = e2m1_decode(np, codes)
    s = np.repeat(e4m3_decode(np, scales), 16, axis=-1)
    return vals * s * scale_2[:, None, None].astype(np.float64)


def silu(np, x):
    return x / (1.0 + np.exp(-x))


def reference_w4a16(np, w, x, topk_ids, topk_weights, activation="silu"):
    """out[t] = sum_j w_tj * W2_e (act(W13_e x_t)) in float64; gate = first half of W13's rows, the
    up half scaled by w13_up_scale_2 when w has one."""
    w13 = dequant(np, w["w13"], w["w13_scale"], w["w13_scale_2"])
    if w.get("w13_up_scale_2") is not None:
        half = w13.shape[1] // 2
        w13[:, half:] = dequant(np, w["w13"], w["w13_scale"], w["w13_up_scale_2"])[:, half:]
    w2 = dequant(np, w["w2"], w["w2_scale"], w["w2_scale_2"])
    x = x.astype(np.float64)
    out = np.zeros((x.shape[0], w2.shape[1]))
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            h = w13[e] @ x[t]
            if activation == "silu":
                i = h.shape[0] // 2
                a = silu(np, h[:i]) * h[i:]
            elif activation == "relu2_no_mul":
                a = np.maximum(h, 0.0) ** 2
            else:
                raise ValueError(activation)
            out[t] += float(topk_weights[t, j]) * (w2[e] @ a)
    return out


def random_weights(np, rng, experts, hidden, inter, gated=True, a4=False):
    """Random NVFP4 tensors in ModelOpt's layout: random codes, E4M3 scales in [0.25, 2), scale_2
    around 1/64."""
    n1 = 2 * inter if gated else inter

    def scales(shape):
        # E4M3 codes with exponent 5..7 (values 0.25 .. <2), any mantissa
        return (rng.integers(5, 8, size=shape) << 3 | rng.integers(0, 8, size=shape)).astype(np.uint8)

    w = {
        "w13": rng.integers(0, 256, size=(experts, n1, hidden // 2), dtype=np.uint8),
        "w13_scale": scales((experts, n1, hidden // 16)),
        "w13_scale_2": (rng.uniform(0.5, 1.5, size=experts) / 64).astype(np.float32),
        "w2": rng.integers(0, 256, size=(experts, hidden, inter // 2), dtype=np.uint8),
        "w2_scale": scales((experts, hidden, inter // 16)),
        "w2_scale_2": (rng.uniform(0.5, 1.5, size=experts) / 64).astype(np.float32),
    }
    if a4:
        w["w13_input_scale"] = np.full(experts, 1.0 / 448, dtype=np.float32)
        w["w2_input_scale"] = np.full(experts, 1.0 / 448, dtype=np.float32)
    return w


def renormalize_topk(np, logits, k):
    """vLLM's renormalize routing: top-k of the logits, softmax over those k (ties: lower index)."""
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, ids, axis=1).astype(np.float64)
    e = np.exp(top - top.max(axis=1, keepdims=True))
    return ids.astype(np.int32), (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
