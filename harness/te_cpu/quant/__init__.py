"""te-cpu's quantization surface: the kernels TE's low-precision recipes call, on CPU.

Numerics (each module imports only torch and its siblings, so a test can load it by path
without applying the CPU layer; ``cases/test_te_cpu_quant*.py`` do):

- :mod:`.formats`: the element formats - E4M3 / E5M2 (saturating round-to-nearest-even
  casts), E8M0 block exponents, E2M1 (FP4) values packed two per byte;
- :mod:`.scaling`: each recipe's scale rule (per-tensor current scaling, delayed scaling's
  amax-history roll and scale update, MXFP8's E8M0 block scales, FP8 block scaling's
  per-block scales, NVFP4's two-level scales);
- :mod:`.per_tensor`, :mod:`.mxfp8`, :mod:`.blockwise`, :mod:`.nvfp4`: one format family
  each - quantize a high-precision matrix into the buffers TE's tensor classes hold, and
  decode them exactly;
- :mod:`.swizzle`: the block-scale layouts TE's GEMM expects;
- :mod:`.qgemm`: a GEMM of quantized operands - each operand decoded exactly to fp32, the
  products accumulated in fp32, the per-tensor factors and epilogue applied, one rounding.

Glue with TE's Python objects (imports TE lazily, only inside a worker rank):
:mod:`.tensors` builds and fills TE's quantized tensor objects as the compiled extension's
``create_tensor`` / ``convert_and_update_tensor`` do; :mod:`.bindings` has the extension
functions with TE's binding signatures, registered by :mod:`harness.te_cpu.extension`.
"""
