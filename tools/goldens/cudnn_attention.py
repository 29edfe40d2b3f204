"""The StableHLO that JAX 0.11.2 emits for cuDNN fused attention on cuda, as references for Kiln's own lowering
(tests/pjrt/stablehlo_cudnn_attention_test.cpp compares the custom call's attributes and types).

Needs no GPU: JAX lowers for the cuda platform without one. Its cuDNN entry point asks the installed cuDNN for
its version and the GPU for its compute capability before lowering; both questions are answered here as a
Hopper GPU with cuDNN 9.10 would (they only gate which shapes JAX accepts, not what it emits).

    python3.12 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install jax==0.11.2 jaxlib==0.11.2
    /tmp/jaxenv/bin/python tools/goldens/cudnn_attention.py tests/data/pjrt
"""
import pathlib
import sys

import jax
import jax.numpy as jnp
from jax._src.cudnn import fused_attention_stablehlo as fa

assert jax.__version__ == "0.11.2", f"the references are pinned to jax 0.11.2, this is {jax.__version__}"
fa.check_cudnn_version = lambda: 91000
fa.check_compute_capability = lambda capability: True

# (file, [B, N, T, H] of q, k and v, dtype, scale, mask): Kiln's q, k, v are [batch, heads, seq, head_dim],
# JAX's BNTH layout.
CASES = [
    ("jax_cudnn_attention_bf16", (1, 2, 128, 64), jnp.bfloat16, 0.125, fa.MaskType.NO_MASK),
    ("jax_cudnn_attention_f16_causal", (2, 3, 16, 32), jnp.float16, 0.3, fa.MaskType.CAUSAL),
]


def main(out_dir):
    out = pathlib.Path(out_dir)
    for name, shape, dtype, scale, mask in CASES:
        x = jax.ShapeDtypeStruct(shape, dtype)

        def attention(q, k, v):
            return fa.dot_product_attention(q, k, v, scale=scale, qkv_layout="BNTH", mask_type=mask)

        lowered = jax.jit(attention).trace(x, x, x).lower(lowering_platforms=("cuda",))
        text = lowered.compiler_ir("stablehlo").operation.get_asm(
            print_generic_op_form=True, enable_debug_info=False)
        (out / f"{name}.mlir").write_text(text)
        print(f"wrote {out / name}.mlir")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/pjrt")
