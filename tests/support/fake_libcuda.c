/*
 * A stand-in libcuda.so.1 (TEST DOUBLE) for the smoke suite's CUDA program
 * (tests/smoke/checks/cuda_check.py): the driver API calls it makes, with the real signatures, on
 * host memory. No GPU can be had here; this checks that the program passes every argument the way
 * the driver API takes it (pointers, sizes, kernel parameters), not what a GPU would compute.
 *
 * The "kernel" is run on the host: it reads the PTX's entry name and adds the vectors whose
 * device pointers (host pointers here) the launch's kernelParams point to.
 *
 * Environment: FAKE_CUDA_UUIDS (the visible GPUs' UUIDs, GPU-xxxxxxxx-xxxx-..., comma-separated)
 * or FAKE_CUDA_DEVICES (a count, UUIDs made up; default 1); FAKE_CUDA_FAIL=<call>:<code> makes that call fail
 * with that CUresult; FAKE_CUDA_WRONG_SUM=1 makes the kernel add wrongly; FAKE_CUDA_NO_PEER=1
 * denies peer access; FAKE_CUDA_LOG=<file> appends each call's name.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef uint64_t CUdeviceptr;

static int contexts[64];
static char kernel_name[64];

static void record(const char *call) {
    const char *log = getenv("FAKE_CUDA_LOG");
    if (log) {
        FILE *file = fopen(log, "a");
        if (file) {
            fprintf(file, "%s\n", call);
            fclose(file);
        }
    }
}

static CUresult outcome(const char *call) {
    record(call);
    const char *fail = getenv("FAKE_CUDA_FAIL");
    size_t length = strlen(call);
    if (fail && strncmp(fail, call, length) == 0 && fail[length] == ':') {
        return atoi(fail + length + 1);
    }
    return 0;
}

static int devices(void) {
    const char *uuids = getenv("FAKE_CUDA_UUIDS");
    if (uuids) {
        int count = *uuids ? 1 : 0;
        for (const char *c = uuids; *c; c++) count += *c == ',';
        return count;
    }
    const char *count = getenv("FAKE_CUDA_DEVICES");
    return count ? atoi(count) : 1;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    switch (error) {
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; break;
    case 802: *name = "CUDA_ERROR_SYSTEM_NOT_READY"; break;
    case 999: *name = "CUDA_ERROR_UNKNOWN"; break;
    default: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    }
    return 0;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    *text = error == 802 ? "system not yet initialized" : "fake error";
    return 0;
}

CUresult cuInit(unsigned int flags) { return flags ? 1 : outcome("cuInit"); }

CUresult cuDeviceGetCount(int *count) {
    *count = devices();
    return outcome("cuDeviceGetCount");
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (ordinal < 0 || ordinal >= devices()) return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *device = ordinal;
    return outcome("cuDeviceGet");
}

CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice device) {
    const char *uuids = getenv("FAKE_CUDA_UUIDS");
    if (!uuids) {
        for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(device * 16 + i);
        return outcome("cuDeviceGetUuid");
    }
    for (int skip = device; skip > 0 && uuids; skip--) {
        uuids = strchr(uuids, ',');
        uuids = uuids ? uuids + 1 : NULL;
    }
    if (!uuids || strncmp(uuids, "GPU-", 4) != 0) return 1;
    const char *hex = uuids + 4;
    for (int i = 0; i < 16; i++) {
        if (*hex == '-') hex++;
        unsigned int byte = 0;
        if (sscanf(hex, "%2x", &byte) != 1) return 1;
        uuid[i] = (unsigned char)byte;
        hex += 2;
    }
    return outcome("cuDeviceGetUuid");
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
    *context = &contexts[device];
    return outcome("cuDevicePrimaryCtxRetain");
}

CUresult cuCtxSetCurrent(CUcontext context) { return context ? outcome("cuCtxSetCurrent") : 1; }

CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t size) {
    void *memory = calloc(1, size);
    if (!memory) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    *pointer = (CUdeviceptr)(uintptr_t)memory;
    return outcome("cuMemAlloc_v2");
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr device, const void *host, size_t size) {
    memcpy((void *)(uintptr_t)device, host, size);
    return outcome("cuMemcpyHtoD_v2");
}

CUresult cuMemcpyDtoH_v2(void *host, CUdeviceptr device, size_t size) {
    memcpy(host, (const void *)(uintptr_t)device, size);
    return outcome("cuMemcpyDtoH_v2");
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    const char *entry = strstr((const char *)image, ".entry ");
    if (!entry) return 218; /* CUDA_ERROR_INVALID_PTX */
    sscanf(entry + 7, "%63[A-Za-z0-9_]", kernel_name);
    *module = kernel_name;
    return outcome("cuModuleLoadData");
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
    if (module != kernel_name || strcmp(name, kernel_name) != 0) return 500; /* NOT_FOUND */
    *function = kernel_name;
    return outcome("cuModuleGetFunction");
}

CUresult cuLaunchKernel(CUfunction function, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                        void *stream, void **parameters, void **extra) {
    if (function != kernel_name || !parameters || extra || gy != 1 || gz != 1 || by != 1
        || bz != 1 || shared || stream) {
        return 1;
    }
    const float *a = (const float *)(uintptr_t)*(CUdeviceptr *)parameters[0];
    const float *b = (const float *)(uintptr_t)*(CUdeviceptr *)parameters[1];
    float *c = (float *)(uintptr_t)*(CUdeviceptr *)parameters[2];
    uint32_t n = *(uint32_t *)parameters[3];
    if ((uint64_t)gx * bx < n) return 1; /* the grid must cover every element */
    int wrong = getenv("FAKE_CUDA_WRONG_SUM") != NULL;
    for (uint32_t i = 0; i < n; i++) c[i] = a[i] + b[i] + (wrong && i == n / 2 ? 1.0f : 0.0f);
    return outcome("cuLaunchKernel");
}

CUresult cuCtxSynchronize(void) { return outcome("cuCtxSynchronize"); }

CUresult cuDeviceCanAccessPeer(int *can, CUdevice device, CUdevice peer) {
    *can = device != peer && getenv("FAKE_CUDA_NO_PEER") == NULL;
    return outcome("cuDeviceCanAccessPeer");
}

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
    return peer && !flags ? outcome("cuCtxEnablePeerAccess") : 1;
}

CUresult cuMemcpyPeer(CUdeviceptr destination, CUcontext destination_context, CUdeviceptr source,
                      CUcontext source_context, size_t size) {
    if (!destination_context || !source_context || destination_context == source_context) return 1;
    memcpy((void *)(uintptr_t)destination, (const void *)(uintptr_t)source, size);
    return outcome("cuMemcpyPeer");
}
