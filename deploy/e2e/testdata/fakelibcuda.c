/* A stand-in for the driver's libcuda on a node without a GPU: a real
 * shared object (soname libcuda.so.1), so that the container's own loader
 * must find it as it finds the driver's. cuInit answers 0 (CUDA_SUCCESS). */
int cuInit(unsigned int flags) { (void)flags; return 0; }
