/*
 * cli_ep.h - expert parallelism in the CLI: `nvfp4moe run --ep N` (tools/cmd_run_ep.c), called by
 * cmd_run when the config's parallel.ep_size > 1, and `nvfp4moe bench --ep N`
 * (tools/cmd_bench_ep.c), called by cmd_bench.
 */
#ifndef NVFP4MOE_CLI_EP_H
#define NVFP4MOE_CLI_EP_H

#include "cli.h"
#include "nvfp4moe_experimental.h"

/* Runs cfg's layer (weights w, host memory, the whole layer) with expert parallelism over
 * cfg->parallel.ep_size ranks, `tokens` tokens per rank: one process per GPU over NCCL when dev is
 * a detected GPU (argc/argv: cmd_run's, re-used to start the rank processes), else the loopback
 * simulation in this process. Prints one line per rank; returns a CLI_EXIT_* code. */
int cli_run_ep(const nvfp4moe_config *cfg, const nvfp4moe_weights *w, long long tokens, const nvfp4moe_device *dev,
               bool device_given, int argc, char **argv);

/* The number of CUDA GPUs (0 in builds without CUDA). */
int cli_cuda_gpu_count(void);
/* Starts ranks 0..N-1 as copies of this process (one per GPU; NCCL_NVLS_ENABLE=0, the rank and
 * the NCCL id file in the environment), waits for them all; returns a CLI_EXIT_* code. */
int cli_launch_ranks(const char *what, int32_t N, int argc, char **argv);

/* A real model's MoE layer shape, as `nvfp4moe bench` names them (tools/cmd_bench.c's table). */
typedef struct cli_layer_preset {
    const char *name;
    int E, H, I, k;
    nvfp4moe_activation act;
    bool limit;
    float limit_value;
} cli_layer_preset;

/* The benchmarks' shared pieces (tools/cli_bench.c). A preset's layer config (nvfp4moe_config_init
 * plus its shape and activation): */
void cli_preset_config(const cli_layer_preset *p, nvfp4moe_config *cfg);
/* n random bytes from seed: E2M1 codes (any byte), or with e4m3 block scale codes in [2^-3, 448]
 * (0x20..0x7E: valid, never zero or NaN). */
void cli_fill_nvfp4(uint8_t *d, size_t n, uint64_t seed, bool e4m3);
/* The stamp of a results file: commit (NULL: `git rev-parse --short HEAD`, else "unknown"), the UTC
 * date and time ("2026-12-03 10:14 UTC") and day ("2026-12-03"). */
void cli_bench_stamp(const char *commit, char *commit_out, size_t commit_len, char *date, size_t date_len, char *day,
                     size_t day_len);
/* The command line as a results file records it: "nvfp4moe bench ..." (argv[0] is "bench"). */
void cli_bench_command(int argc, char **argv, char *buf, size_t len);

/* --hot-tokens N of `bench` and `bench --cpu`: skewed routing, N of each point's M tokens (all of
 * them when M <= N) made to pick expert 0 first (nvfp4moe_hot_expert_logits on the point's random
 * logits, drawn from the logits' own seed); 0, the default, is uniform routing. */
#define CLI_BENCH_HOT_HELP "skewed routing: N of each point's M tokens (all of them when M <= N),\n" \
                           "a seeded random subset, get expert 0 as their first choice\n" \
                           "(default 0: uniform routing)"
/* The routing of a benchmark's points in words, for its markdown: uniform random routing, or with
 * hot > 0 (--hot-tokens) the hot-expert routing and its N. */
void cli_bench_routing_words(long long hot, char *buf, size_t len);

/* Parses a comma-separated list of preset names (flag: for messages) into out (at most cap);
 * returns the count, or -1 after a message naming the unknown one and the nearest preset. */
int cli_parse_presets(const char *flag, const char *list, const cli_layer_preset *presets, int n,
                      const cli_layer_preset **out, int cap);

/* Where a benchmark's progress text goes: stdout, or stderr under --json (stdout then carries the
 * JSON lines). */
extern FILE *cli_bench_text;

/* The benchmarks' default output prefix: "nvfp4moe-bench/<day>-<what>", in the current directory. */
#define CLI_BENCH_DEFAULT_DIR "nvfp4moe-bench"
void cli_bench_default_prefix(const char *day, const char *what, char *buf, size_t len);

/* Writes rows (JSON objects, one per line of PREFIX.csv) to PREFIX.jsonl, one compact object per
 * line, and with to_stdout prints the same lines on stdout. Steals the references. Returns -1
 * after a message naming the file. */
typedef struct json_t json_t;
int cli_bench_write_jsonl(const char *prefix, json_t **rows, int n, bool to_stdout);

/* `nvfp4moe bench --ep N ...` (argv[0] is "bench"): the EP time split and all-to-all bandwidth on
 * the given presets, over NCCL (one process per GPU) or the loopback; see its --help. Returns a
 * CLI_EXIT_* code. Builds without CUDA run it too (loopback on the CPU). */
int cli_bench_ep(int argc, char **argv, const cli_layer_preset *presets, int npresets);

/* `nvfp4moe bench --cpu ...`: CPU_FAST on the given presets against the read bandwidth measured
 * in the same run (tools/cmd_bench_cpu.c); see its --help. Returns a CLI_EXIT_* code. */
int cli_bench_cpu(int argc, char **argv, const cli_layer_preset *presets, int npresets);

#endif // NVFP4MOE_CLI_EP_H
