/* cohort: is there an NVIDIA GPU, whatever the CUDA runtime says? (see
 * device.h, ch_device_gpu_evidence). Plain C, compiled in every build, so
 * that the CPU tests check it. */
#include "config.h"

#include "framework/tensor/device.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* "<root><path>" into buf; root NULL or "" is the file system root. */
static void at_root(char *buf, size_t len, const char *root, const char *path)
{
    snprintf(buf, len, "%s%s", root ? root : "", path);
}

/* nvidia<digits>: a GPU's device node (not nvidiactl, nvidia-uvm, ...). */
static int gpu_node_name(const char *n)
{
    if (strncmp(n, "nvidia", 6) != 0 || n[6] < '0' || n[6] > '9') return 0;
    for (const char *p = n + 6; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

/* Any entry but . and .. (one folder per GPU the kernel module drives). */
static int any_name(const char *n) { return n[0] != '.'; }

/* The first entry of <root><rel> that `accept` takes, named in what. */
static int first_entry(const char *root, const char *rel, int (*accept)(const char *),
                       char *what, size_t len)
{
    char dir[4096];
    at_root(dir, sizeof dir, root, rel);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        if (!accept(e->d_name)) continue;
        if (what && len) snprintf(what, len, "%s/%s", dir, e->d_name);
        found = 1;
    }
    closedir(d);
    return found;
}

/* An executable nvidia-smi in one of PATH's folders (never run). */
static int smi_on_path(const char *path, char *what, size_t len)
{
    if (!path || !*path) return 0;
    const char *p = path;
    while (*p) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > 0 && n < 4000) {
            char file[4096];
            snprintf(file, sizeof file, "%.*s/nvidia-smi", (int)n, p);
            struct stat st;
            if (stat(file, &st) == 0 && S_ISREG(st.st_mode) && access(file, X_OK) == 0) {
                if (what && len) snprintf(what, len, "%s", file);
                return 1;
            }
        }
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

int ch_device_gpu_evidence(const char *root, const char *path, char *what, size_t len)
{
    if (what && len) what[0] = 0;
    if (first_entry(root, "/dev", gpu_node_name, what, len) ||
        first_entry(root, "/proc/driver/nvidia/gpus", any_name, what, len))
        return 1;
    return smi_on_path(path ? path : getenv("PATH"), what, len);
}

static pthread_once_t evidence_once = PTHREAD_ONCE_INIT;
static int evidence_found;
static char evidence_what[512];

static void probe_once(void)
{
    evidence_found = ch_device_gpu_evidence(NULL, NULL, evidence_what, sizeof evidence_what);
}

int ch_device_gpu_present(char *what, size_t len)
{
    pthread_once(&evidence_once, probe_once);
    if (what && len) snprintf(what, len, "%s", evidence_found ? evidence_what : "");
    return evidence_found;
}

ch_status ch_device_driver_error(int driver_version, int runtime_version, const char *evidence)
{
    const char *ev = evidence && *evidence ? evidence : "a GPU";
    if (driver_version <= 0)
        return CH_ERROR(CH_ERR_CUDA,
                        "this machine has a GPU (%s) but no CUDA driver could be loaded "
                        "(libcuda.so.1) for the CUDA %d.%d runtime cohort was built with: "
                        "install or load the NVIDIA driver (on a cluster, a GPU partition "
                        "or a driver module); cohort does not fall back to the CPU here",
                        ev, runtime_version / 1000, runtime_version % 1000 / 10);
    return CH_ERROR(CH_ERR_CUDA,
                    "the NVIDIA driver on this machine (%s) supports CUDA up to %d.%d, older "
                    "than the CUDA %d.%d runtime cohort was built with "
                    "(cudaErrorInsufficientDriver): update the driver or rebuild cohort with "
                    "a CUDA toolkit no newer than %d.%d; cohort does not fall back to the CPU "
                    "here",
                    ev, driver_version / 1000, driver_version % 1000 / 10,
                    runtime_version / 1000, runtime_version % 1000 / 10,
                    driver_version / 1000, driver_version % 1000 / 10);
}
