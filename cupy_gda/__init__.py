"""cupy_gda: CUDA kernels for gated linear attention (fla's GLA), run through CuPy.

    S_t = diag(g_t) · S_{t-1} + k_t v_tᵀ,    o_t = scale · S_tᵀ q_t

See :func:`gated_attention`, :func:`gated_attention_backward`, :func:`gated_attention_step` and
:mod:`cupy_gda.reference`.
"""
from cupy_gda import reference
from cupy_gda._api import (ChunkStates, gated_attention, gated_attention_backward,
                           gated_attention_step)
from cupy_gda._checks import MAX_DIM
from cupy_gda._compile import KernelCompileError
from cupy_gda.reference import Gradients

__version__ = "0.1.0"
__all__ = ["gated_attention", "gated_attention_backward", "gated_attention_step", "Gradients",
           "ChunkStates", "reference", "MAX_DIM", "KernelCompileError"]
