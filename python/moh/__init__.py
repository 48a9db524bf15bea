"""moh for Python: the MoH attention module of the official code (SkyworkAI/MoH) on moh's
head-sparse kernels. `from moh.torch import MoHAttention` (needs torch)."""
__version__ = "0.1.0"
