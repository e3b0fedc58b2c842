/* Tests for framework/tensor/device_probe.c: the signs of a GPU that need no
 * CUDA runtime (device nodes, /proc/driver/nvidia/gpus, nvidia-smi on PATH),
 * checked in a scratch root, and the error a GPU node with a missing or too
 * old driver gets instead of a silent "0 GPUs" (issue #25). */
#include "config.h"

#include "tests/harness.h"

#include "framework/tensor/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char root[256];
} scratch_t;

static void mkdirs(const char *root, const char *rel)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    for (char *q = p + strlen(root) + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            mkdir(p, 0755);
            *q = '/';
        }
    mkdir(p, 0755);
}

static void touch(const char *root, const char *rel, mode_t mode)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("#!/bin/sh\nexit 0\n", f);
    fclose(f);
    assert_int_equal(chmod(p, mode), 0);
}

static int setup(void **state)
{
    scratch_t *s = calloc(1, sizeof *s);
    if (!s) return -1;
    snprintf(s->root, sizeof s->root, "/tmp/cohort-devprobe.XXXXXX");
    if (!mkdtemp(s->root)) return -1;
    *state = s;
    return 0;
}

static int teardown(void **state)
{
    scratch_t *s = *state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->root);
    if (system(cmd) != 0) return -1;
    free(s);
    return 0;
}

static void test_no_evidence(void **state)
{
    scratch_t *s = *state;
    char what[512] = "x";
    mkdirs(s->root, "dev");
    mkdirs(s->root, "bin");
    /* the control nodes exist with a driver and no GPU: not a GPU */
    touch(s->root, "dev/nvidiactl", 0644);
    touch(s->root, "dev/nvidia-uvm", 0644);
    touch(s->root, "dev/nvidia0x", 0644);
    /* an nvidia-smi that cannot be executed is no sign either */
    touch(s->root, "bin/nvidia-smi", 0644);
    char path[1024];
    snprintf(path, sizeof path, "%s/bin:%s/none", s->root, s->root);
    assert_int_equal(ch_device_gpu_evidence(s->root, path, what, sizeof what), 0);
    assert_string_equal(what, "");
    assert_int_equal(ch_device_gpu_evidence(s->root, "", NULL, 0), 0);
}

static void test_device_node(void **state)
{
    scratch_t *s = *state;
    char what[512];
    mkdirs(s->root, "dev");
    touch(s->root, "dev/nvidia3", 0644);
    assert_int_equal(ch_device_gpu_evidence(s->root, "", what, sizeof what), 1);
    assert_non_null(strstr(what, "/dev/nvidia3"));
}

static void test_proc_gpus(void **state)
{
    scratch_t *s = *state;
    char what[512];
    mkdirs(s->root, "proc/driver/nvidia/gpus/0000:17:00.0");
    assert_int_equal(ch_device_gpu_evidence(s->root, "", what, sizeof what), 1);
    assert_non_null(strstr(what, "gpus/0000:17:00.0"));
}

static void test_smi_on_path(void **state)
{
    scratch_t *s = *state;
    char what[512], path[1024];
    mkdirs(s->root, "a");
    mkdirs(s->root, "b");
    touch(s->root, "b/nvidia-smi", 0755);
    /* empty PATH entries and missing folders are passed over */
    snprintf(path, sizeof path, "::%s/a:%s/missing:%s/b", s->root, s->root, s->root);
    assert_int_equal(ch_device_gpu_evidence(s->root, path, what, sizeof what), 1);
    assert_non_null(strstr(what, "/b/nvidia-smi"));
}

static void test_driver_error(void **state)
{
    (void)state;
    /* a 12.2 driver under a 13.0 runtime */
    assert_int_equal(ch_device_driver_error(12020, 13000, "device node /dev/nvidia0"),
                     CH_ERR_CUDA);
    const char *m = ch_error_message();
    assert_non_null(strstr(m, "supports CUDA up to 12.2"));
    assert_non_null(strstr(m, "CUDA 13.0 runtime"));
    assert_non_null(strstr(m, "/dev/nvidia0"));
    assert_non_null(strstr(m, "does not fall back to the CPU"));
    /* no driver at all (libcuda missing) */
    assert_int_equal(ch_device_driver_error(0, 12080, NULL), CH_ERR_CUDA);
    m = ch_error_message();
    assert_non_null(strstr(m, "no CUDA driver could be loaded"));
    assert_non_null(strstr(m, "CUDA 12.8 runtime"));
    ch_error_clear();
}

/* On this machine: no sign of a GPU -> count is 0 and CH_OK (a CPU machine,
 * with or without the toolkit); a sign of a GPU -> either GPUs are counted
 * or the count is an error naming the driver, never a silent 0. */
static void test_this_machine(void **state)
{
    (void)state;
    char what[512];
    int present = ch_device_gpu_present(what, sizeof what);
    assert_int_equal(present, ch_device_gpu_evidence(NULL, NULL, NULL, 0));
    int n = -1;
    ch_status s = ch_device_count(&n);
    if (!present) {
        assert_int_equal(s, CH_OK);
        assert_int_equal(n, 0);
    } else if (ch_device_backend_compiled()) {
        if (s == CH_OK) {
            assert_true(n > 0);
        } else {
            assert_int_equal(s, CH_ERR_CUDA);
            assert_int_equal(n, 0);
            print_message("# %s\n", ch_error_message());
        }
    }
    ch_error_clear();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_no_evidence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_device_node, setup, teardown),
        cmocka_unit_test_setup_teardown(test_proc_gpus, setup, teardown),
        cmocka_unit_test_setup_teardown(test_smi_on_path, setup, teardown),
        cmocka_unit_test(test_driver_error),
        cmocka_unit_test(test_this_machine),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
