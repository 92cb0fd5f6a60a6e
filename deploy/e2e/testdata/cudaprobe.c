/* What a CUDA program does first, in an image with its own LD_LIBRARY_PATH:
 * the container's loader finds libcuda.so.1 by its soname, and cuInit
 * answers. Prints "libcuda: ok" and the LD_LIBRARY_PATH the container
 * has, or why not, and exits 1. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
	const char *path = getenv("LD_LIBRARY_PATH");
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) {
		printf("libcuda: %s; LD_LIBRARY_PATH=%s\n", dlerror(), path ? path : "");
		return 1;
	}
	int (*cu_init)(unsigned int) = (int (*)(unsigned int))dlsym(h, "cuInit");
	if (!cu_init || cu_init(0) != 0) {
		printf("libcuda: no working cuInit; LD_LIBRARY_PATH=%s\n", path ? path : "");
		return 1;
	}
	printf("libcuda: ok; LD_LIBRARY_PATH=%s\n", path ? path : "");
	return 0;
}
