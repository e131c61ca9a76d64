"""TE on CPU: the layer that runs TransformerEngine's own Python code on this machine.

Importing this package does nothing; its modules are the layer's parts - the ``torch.cuda``
surface TE touches (``cuda_surface``), the CPU module standing in for TE's compiled extension
(``extension``: its GEMMs ``gemm`` and ``grouped``, normalizations ``norm``, quantization
kernels ``quant/``), TE's import (``loader``), Triton's interpreter and the stand-ins for TE's
kernels (``interpreter``, ``kernel_standins``, ``launch_memo``), the device it presents
(``device``) and the kernels it saw called (``evidence``). Two modules are backends, and
importing either *applies* the layer to the process: ``backend`` (``--backend te-cpu``) and
``tf32`` (``--backend te-cpu-tf32``). Only worker ranks and the backend probe import them.
"""
