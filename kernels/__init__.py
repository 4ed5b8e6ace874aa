"""The kernels and adapters under test: the Triton and CUDA kernels, the SDPA, Flex and
flash-attn adapters, and the attention layer built on any of them. What they declare and how
they are found is the contract (``flashprop.contract``)."""
