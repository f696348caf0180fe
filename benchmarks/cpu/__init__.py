"""CPU studies: host attention against the read, the decode and prefill kernels, pools and prefetch hints."""
