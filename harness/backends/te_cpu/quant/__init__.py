"""te-cpu's quantization surface: the kernels TE's low-precision recipes call, on CPU.

Numerics (each module imports only torch and its siblings, so a test can load it by path
without applying the CPU layer; ``cases/test_te_cpu_quant*.py`` do):

- :mod:`.formats`: the element formats - E4M3 / E5M2 (saturating round-to-nearest-even
  casts), E8M0 block exponents, E2M1 (FP4) values packed two per byte;
- :mod:`.scaling`: the scale rules from an amax (current scaling's, which FP8 block
  scaling applies per block) and delayed scaling's amax-history roll and scale update;
  MXFP8's E8M0 block scales are :mod:`.mxfp8`'s;
- :mod:`.per_tensor`, :mod:`.mxfp8`, :mod:`.blockwise`: one format family each - quantize a
  high-precision matrix into the buffers TE's tensor classes hold, and decode them exactly
  (NVFP4 is not built: ``docs/low-precision.md`` says why; its E2M1 element format is in
  :mod:`.formats`);
- :mod:`.swizzle`: the block-scale layouts TE's GEMM expects;
- :mod:`.qgemm`: a GEMM of quantized operands - each operand decoded exactly to fp32, the
  products accumulated in fp32, the per-tensor factors and epilogue applied, one rounding.

Glue with TE's Python objects (imports TE lazily, only inside a worker rank):
:mod:`.tensors` builds and fills TE's quantized tensor objects as the compiled extension's
``create_tensor`` / ``convert_and_update_tensor`` do; :mod:`.bindings` has the extension
functions with TE's binding signatures, registered by :mod:`harness.backends.te_cpu.extension`.
"""
