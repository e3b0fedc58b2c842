/* cohort: the compute context's config keys (compute.*) and
 * ch_compute_from_config (see ops.h). */
#include "config.h"

#include "framework/ops/ops.h"

#include <stddef.h>

/* Names, defaults and help as cohort-train has always had them (users'
 * config files keep working). */
static const ch_config_key_t compute_keys[] = {
    {"compute.allow_tf32", CH_CFG_BOOL, "true", CH_CFG_NO_RANGE,
     "GPU: cuDNN convolutions may use TF32 tensor cores (torch.backends.cudnn.allow_tf32); "
     "linear layers stay fp32. Ignored on CPU ranks."},
    {"compute.bf16", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "The older spelling of compute.precision = bf16 (true means bf16; either key turns it "
     "on)."},
    {"compute.conv_search", CH_CFG_STRING, "heuristics", CH_CFG_NO_RANGE,
     "GPU: convolution algorithm choice: heuristics (cuDNN's ranking) or timed "
     "(cudnnFind*, torch.backends.cudnn.benchmark = True). Ignored on CPU ranks."},
    {"compute.deterministic", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "GPU: only deterministic cuDNN convolution algorithms (torch.backends.cudnn.deterministic): "
     "bitwise the same results run after run, at some cost in speed. CPU ranks are "
     "deterministic always."},
    {"compute.precision", CH_CFG_STRING, "fp32", CH_CFG_NO_RANGE,
     "fp32 or bf16: bf16 autocast for convolutions and linear layers (bf16 inputs and weights, "
     "fp32 accumulation; fp32 master weights, optimizer, batch norm, loss and checkpoints; "
     "torch.autocast(dtype=torch.bfloat16)). GPU: cuDNN/cuBLAS bf16. CPU: oneDNN's bf16 "
     "kernels, on CPUs whose oneDNN ISA has bf16 (avx512_core_bf16, avx512_core_amx; "
     "ONEDNN_MAX_CPU_ISA applies); refused at job start elsewhere (docs/SEMANTICS.md)."},
    {"compute.gpu_workspace_mb", CH_CFG_INT, "1024", 1, 1048576,
     "GPU: cap on the cuDNN convolution workspace in MiB. Ignored on CPU ranks."},
    {"compute.cpu_conv_algorithm", CH_CFG_STRING, "direct", CH_CFG_NO_RANGE,
     "CPU: algorithm of the 3x3 stride-1 convolutions: direct (oneDNN's direct kernels, "
     "what PyTorch's CPU path runs: results agree with PyTorch to fp32 rounding), auto "
     "(oneDNN's choice: Winograd F(4x4,3x3) where it has it, AVX-512 only, and judges it "
     "faster) or winograd (wherever oneDNN has it). Winograd rounds differently (differences "
     "of about 1e-6 of the largest value per convolution); on AVX-512 it trained resnet18/34 at "
     "3x224x224 1.6-1.8x faster, resnet50 1.15x, and changes little at 28x28 "
     "(docs/PERFORMANCE.md). Ignored on GPU ranks."},
};

const char *const ch_compute_precision_names[2] = {"fp32", "bf16"};
const char *const ch_compute_conv_search_names[2] = {"heuristics", "timed"};
const char *const ch_compute_cpu_conv_algorithm_names[3] = {"direct", "auto", "winograd"};

ch_config_table_t ch_compute_config_table(void)
{
    ch_config_table_t t = {"compute", compute_keys,
                           (int)(sizeof compute_keys / sizeof compute_keys[0])};
    return t;
}

ch_status ch_compute_from_config(const ch_config_t *cfg, ch_compute_options_t *o)
{
    CH_REQUIRE(cfg != NULL && o != NULL, "ch_compute_from_config: NULL config or options");
    ch_compute_options_t r;
    ch_compute_options_default(&r);
    int mb = 0, prec = 0, old = 0;
    CH_TRY(ch_config_get_bool(cfg, "compute.allow_tf32", &r.allow_tf32));
    CH_TRY(ch_config_get_bool(cfg, "compute.bf16", &old));
    CH_TRY(ch_config_get_choice(cfg, "compute.precision", ch_compute_precision_names, 2, &prec));
    r.bf16 = old || prec == 1;
    CH_TRY(ch_config_get_choice(cfg, "compute.conv_search", ch_compute_conv_search_names, 2,
                                &r.conv_search));
    CH_TRY(ch_config_get_bool(cfg, "compute.deterministic", &r.deterministic));
    CH_TRY(ch_config_get_int(cfg, "compute.gpu_workspace_mb", &mb));
    CH_TRY(ch_config_get_choice(cfg, "compute.cpu_conv_algorithm",
                                ch_compute_cpu_conv_algorithm_names, 3, &r.cpu_conv_algorithm));
    r.gpu_workspace_bytes = (size_t)mb << 20;
    *o = r;
    return CH_OK;
}
