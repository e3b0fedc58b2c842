/* cohort: the job runtime (see job.h). The setup steps, their verdicts and
 * the teardown moved here from jobs/cohort-train.c so that every job has
 * them. */
#define _GNU_SOURCE /* strdup */
#include "config.h"

#include "framework/runtime/job.h"

#include "framework/core/log.h"
#include "framework/launch/signals.h"
#include "framework/tensor/device.h"
#include "io/state/atomic_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The name of the user's stop file inside the output directory, and what
 * rank 0 renames it to once it has stopped for it (the sbatch templates do
 * not requeue a job that stopped for its stop file). */
#define STOP_FILE_NAME "STOP"
#define STOPPED_FILE_NAME "STOPPED"
/* The run-directory lock file (see lock_output_dir). */
#define LOCK_FILE_NAME "cohort.lock"

typedef struct {
    void (*fn)(void *arg);
    void *arg;
} cleanup_t;

struct ch_job {
    char name[128];
    int mpi_started;  /* this runtime called MPI_Init_thread (and finalizes) */
    int rank, world;  /* MPI_COMM_WORLD */
    ch_env_t env;
    int env_ok;
    ch_pg_t *pg, *nccl;
    ch_config_t *cfg;
    ch_compute_t *cx;
    int on_gpu;
    ch_prof_t *prof;
    const char *out_dir; /* string of cfg */
    char *stop_file;     /* <out_dir>/STOP, or NULL */
    int lock_fd;         /* rank 0: <out_dir>/cohort.lock, locked; else -1 */
    char **made_dirs;    /* rank 0: the directories mkdir -p made for out_dir, in order */
    int n_made_dirs;
    int made_lock;       /* rank 0: this run created out_dir's lock file */
    int warning_signal;
    int requeue;
    int running;         /* ch_job_init returned CH_JOB_CONTINUE */
    int peer_lost;       /* a collective failed: no more collectives */
    int stop_requested;
    int stop_reasons;
    int stop_signal;
    double timeout;      /* dist.timeout, seconds; 0: no watchdog */
    /* watchdog (ch_job_heartbeat): armed at the first beat */
    pthread_t watchdog;
    int watchdog_started, watchdog_quit;
    int tearing_down;    /* in ch_job_finalize: the watchdog's line says so */
    double last_beat;
    pthread_mutex_t beat_mu;
    pthread_cond_t beat_cv;
    cleanup_t *cleanups;
    int n_cleanups, cap_cleanups;
    int is_tty;
    /* progress: the clock of the current `what` */
    char progress_what[128];
    double progress_t0;
    int64_t progress_done0, progress_last;
    int progress_open; /* a bar without its final newline is on the terminal */
    /* COHORT_TEST_HOLD=KIND:N:DIR (ch_job_test_hold); hold_kind NULL: unset */
    char *hold_kind, *hold_dir;
    long long hold_n;
    int hold_done;
};

/* ------------------------------------------------------------------ keys */

static const ch_config_key_t runtime_keys[] = {
    {"dist.device_rule", CH_CFG_STRING, "auto", CH_CFG_NO_RANGE,
     "GPU choice: auto (Slurm: SLURM_PROCID mod devices; else local rank), slurm_procid_mod, local_rank."},
    {"dist.warning_signal", CH_CFG_STRING, "USR2", CH_CFG_NO_RANGE,
     "Signal announcing preemption (besides SIGTERM), e.g. from #SBATCH --signal=B:USR2@120."},
    {"dist.requeue", CH_CFG_BOOL, "false", CH_CFG_NO_RANGE,
     "On preemption, run 'scontrol requeue $SLURM_JOB_ID' after writing the resume file."},
    {"dist.timeout", CH_CFG_FLOAT, "1800", 0, 1e7,
     "Seconds a rank may go without reaching a step boundary once the first step began; "
     "then it ends with exit 4, as a peer rank is gone or hung (torch.distributed's "
     "init_process_group timeout, 30 min). The teardown at the end (process groups, "
     "profile table) gets the same limit. 0: wait forever."},
};

ch_config_table_t ch_job_runtime_table(void)
{
    ch_config_table_t t = {"runtime", runtime_keys,
                           (int)(sizeof runtime_keys / sizeof runtime_keys[0])};
    return t;
}

void ch_job_options_default(ch_job_options_t *opt, const char *name, const char *summary)
{
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->name = name;
    opt->summary = summary;
    opt->mpi_thread_level = MPI_THREAD_FUNNELED;
}

/* ------------------------------------------------------------------ time */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------ verdicts */

static MPI_Comm job_comm(const ch_job_t *job)
{
    return job->pg ? ch_pg_mpi_comm(job->pg) : MPI_COMM_WORLD;
}

/* "rank K" from an MPI error text ("... with rank 1 ...", MPICH's wording),
 * or -1. */
static int rank_in_mpi_error(const char *text)
{
    for (const char *p = text; (p = strstr(p, "rank ")) != NULL; p += 5) {
        char *end;
        long r = strtol(p + 5, &end, 10);
        if (end != p + 5 && r >= 0 && r < INT_MAX) return (int)r;
    }
    return -1;
}

/* A collective failed: a peer rank is gone (or the network is). One line
 * from this rank, naming the lost rank when MPI's message does; no
 * collective after this. */
static void report_peer_lost_text(ch_job_t *job, const char *what, const char *detail)
{
    if (job->peer_lost) return;
    job->peer_lost = 1;
    char text[CH_ERROR_MAX];
    snprintf(text, sizeof text, "%s", detail ? detail : "");
    for (char *p = text; *p; p++)
        if (*p == '\n') *p = ' ';
    int lost = rank_in_mpi_error(text);
    char who[64];
    if (lost >= 0 && lost != job->rank)
        snprintf(who, sizeof who, "rank %d is gone", lost);
    else
        snprintf(who, sizeof who, "another rank is gone");
    char line[CH_ERROR_MAX + 512];
    snprintf(line, sizeof line, "%s: rank %d: %s (%s failed: %s); the job is ending (exit %d)\n",
             job->name, job->rank, who, what ? what : "a collective", text, CH_EXIT_PEER_LOST);
    fputs(line, stderr);
    fflush(stderr);
}

static void report_peer_lost(ch_job_t *job, const char *what, int mpi_rc)
{
    char text[MPI_MAX_ERROR_STRING + 1] = "";
    int len = 0;
    if (MPI_Error_string(mpi_rc, text, &len) != MPI_SUCCESS) len = 0;
    text[len > 0 && len <= MPI_MAX_ERROR_STRING ? len : 0] = 0;
    report_peer_lost_text(job, what, text);
}

int ch_job_check_collective(ch_job_t *job, ch_status s, const char *what)
{
    if (s == CH_OK) return 0;
    if (job && s == CH_ERR_MPI) {
        report_peer_lost_text(job, what, ch_error_message());
        return CH_EXIT_PEER_LOST;
    }
    ch_fatal(what ? what : "collective", CH_EXIT_ERROR);
}

int ch_job_agree(ch_job_t *job, ch_status local, const char *what)
{
    if (!job) return local != CH_OK;
    char saved[CH_ERROR_MAX] = "";
    if (local != CH_OK) snprintf(saved, sizeof saved, "%s", ch_error_message());
    if (job->peer_lost) return 1;
    /* [0]: the rank that reports, MIN: ranks whose failure is their own
     * (not CH_ERR_REMOTE, "another rank failed") come first, then the
     * lowest rank; [1]: ranks whose failure is their own, SUM (the count
     * the line gives: a rank that only learned of another's failure is
     * not one that failed) */
    int key = INT_MAX, n_failed = local != CH_OK && local != CH_ERR_REMOTE;
    if (local != CH_OK) key = (local == CH_ERR_REMOTE ? 1 << 30 : 0) | job->rank;
    int rc = MPI_SUCCESS, all_key = key, all_failed = n_failed;
    if (job->world > 1) {
        rc = MPI_Allreduce(&key, &all_key, 1, MPI_INT, MPI_MIN, job_comm(job));
        if (rc == MPI_SUCCESS)
            rc = MPI_Allreduce(&n_failed, &all_failed, 1, MPI_INT, MPI_SUM, job_comm(job));
    }
    if (rc != MPI_SUCCESS) {
        report_peer_lost(job, what, rc);
        return 1;
    }
    if (all_key == INT_MAX) return 0;
    if (key == all_key) {
        char rank_part[64] = "", count_part[96] = "";
        if (job->world > 1) snprintf(rank_part, sizeof rank_part, "rank %d: ", job->rank);
        if (all_failed > 1 && all_failed == job->world)
            snprintf(count_part, sizeof count_part, " [on all %d ranks]", job->world);
        else if (all_failed > 1)
            snprintf(count_part, sizeof count_part, " [on %d of %d ranks; the lowest shown]",
                     all_failed, job->world);
        char line[CH_ERROR_MAX + 512];
        snprintf(line, sizeof line, "%s: %s%s%s%s%s\n", job->name, rank_part, what ? what : "",
                 what ? ": " : "", saved[0] ? saved : ch_status_name(local), count_part);
        fputs(line, stderr);
        fflush(stderr);
    }
    /* keep this rank's own message for the caller */
    if (local != CH_OK) ch_error_adopt(local, saved);
    return 1;
}

/* ------------------------------------------------------------------ files */

/* rmdir the directories of made[0..n), last first, and free the list: each
 * goes only if it is empty (a directory something else was written to
 * stays, with its parents). */
static void remove_made_dirs(char **made, int n)
{
    int gone = 1;
    for (int i = n - 1; i >= 0; i--) {
        if (gone && rmdir(made[i]) != 0) gone = 0;
        free(made[i]);
    }
    free(made);
}

/* mkdir -p: create dir and every missing parent (mode 0777 & ~umask).
 * *made / *n_made get the directories this call created, in the order it
 * created them (malloc'd; free with remove_made_dirs, which removes them
 * too), whatever the spelling of dir ("a/./b", "a/../c"); on failure the
 * ones it made are removed again and the list is empty. */
static ch_status make_dirs(const char *dir, char ***made, int *n_made)
{
    *made = NULL;
    *n_made = 0;
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path) return CH_ERROR(CH_ERR_IO, "'%s': empty or too long", dir);
    memcpy(path, dir, n + 1);
    ch_status s = CH_OK;
    for (size_t i = 1; i <= n && s == CH_OK; i++) {
        if (path[i] != '/' && path[i] != 0) continue;
        char c = path[i];
        path[i] = 0;
        if (mkdir(path, 0777) == 0) {
            char **grown = realloc(*made, (size_t)(*n_made + 1) * sizeof *grown);
            char *copy = grown ? strdup(path) : NULL;
            if (grown) *made = grown;
            if (copy) (*made)[(*n_made)++] = copy;
            else s = CH_ERROR(CH_ERR_NOMEM, "out of memory creating '%s'", dir);
        } else if (errno != EEXIST) {
            s = CH_ERROR(CH_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
        }
        path[i] = c;
    }
    if (s != CH_OK) {
        remove_made_dirs(*made, *n_made);
        *made = NULL;
        *n_made = 0;
    }
    return s;
}

/* The output directory exists, is a directory, and a file can be created
 * and removed there (a probe, before any work). CH_ERR_IO naming dir. Not
 * ch_checkpoint_check_dir: its messages speak of a checkpoint directory, and
 * not every job's output directory holds checkpoints (a farm's run dir). */
static ch_status probe_output_dir(const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) return CH_ERROR(CH_ERR_IO, "'%s': %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return CH_ERROR(CH_ERR_IO, "'%s' is not a directory", dir);
    char tmp[4096 + 32];
    snprintf(tmp, sizeof tmp, "%s/.cohort-probe.XXXXXX", dir);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) return CH_ERROR(CH_ERR_IO, "'%s' is not writable: %s", dir, strerror(errno));
    close(fd);
    unlink(tmp);
    return CH_OK;
}

/* The target name of an atomic writer's temporary file
 * ".<name>.tmp.XXXXXX" (io/state/atomic_file.h), or 0 when `entry` is not one. */
static int temp_target(const char *entry, char *target, size_t len)
{
    static const char tag[] = ".tmp.";
    size_t n = strlen(entry);
    const size_t suffix = 6; /* mkstemp's XXXXXX */
    if (entry[0] != '.' || n < 1 + 1 + (sizeof tag - 1) + suffix) return 0;
    const char *t = entry + n - suffix - (sizeof tag - 1);
    if (strncmp(t, tag, sizeof tag - 1)) return 0;
    size_t name_len = (size_t)(t - entry) - 1;
    if (name_len == 0 || name_len >= len) return 0;
    memcpy(target, entry + 1, name_len);
    target[name_len] = 0;
    return 1;
}

/* Remove the temporary files of every atomic write in dir left by a writer
 * killed in an earlier run (model files, the resume file, ...; the files
 * themselves are intact: writes are atomic). One log line per target. */
static ch_status remove_stale_temps(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return CH_ERROR(CH_ERR_IO, "cannot read directory '%s' to remove stale temporary files: %s",
                        dir, strerror(errno));
    /* collect the targets first: removing while reading a directory may
     * skip entries */
    char **targets = NULL;
    int n = 0, cap = 0;
    ch_status s = CH_OK;
    struct dirent *ent;
    while (s == CH_OK && (ent = readdir(d)) != NULL) {
        char target[NAME_MAX + 1];
        if (!temp_target(ent->d_name, target, sizeof target)) continue;
        int seen = 0;
        for (int i = 0; i < n && !seen; i++) seen = !strcmp(targets[i], target);
        if (seen) continue;
        if (n == cap) {
            int nc = cap ? 2 * cap : 8;
            char **t = realloc(targets, (size_t)nc * sizeof *t);
            if (!t) {
                s = CH_ERROR(CH_ERR_NOMEM, "out of memory listing '%s'", dir);
                break;
            }
            targets = t;
            cap = nc;
        }
        targets[n] = strdup(target);
        if (!targets[n]) s = CH_ERROR(CH_ERR_NOMEM, "out of memory listing '%s'", dir);
        else n++;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        if (s == CH_OK) {
            size_t len = strlen(dir) + 1 + strlen(targets[i]) + 1;
            char *path = malloc(len);
            int removed = 0;
            if (!path) {
                s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
            } else {
                snprintf(path, len, "%s/%s", dir, targets[i]);
                s = ch_atomic_file_remove_stale(path, &removed);
                if (s == CH_OK && removed)
                    ch_log_info("removed %d stale temporary file%s of %s", removed,
                                removed == 1 ? "" : "s", path);
                free(path);
            }
        }
        free(targets[i]);
    }
    free(targets);
    return s;
}

/* The run-directory lock. Rank 0 holds a POSIX write lock on
 * <dir>/cohort.lock for the whole run; the file says who holds it,
 * "host=H job=J pid=P" (J: SLURM_JOB_ID, "-" outside Slurm).
 *
 * fcntl locks, not flock(2): fcntl (POSIX record) locks are the ones the
 * shared file systems carry between nodes: NFSv4 natively (NFSv3 through
 * NLM/lockd), Lustre when mounted with -o flock (-o localflock makes them
 * node-local, the default noflock refuses them with ENOSYS), GPFS and
 * BeeGFS cluster-wide. Linux's NFS client only emulates flock(2) with a
 * whole-file fcntl lock since 2.6.12, and elsewhere flock may be node-local.
 * Open-file-description locks (F_OFD_SETLK, Linux >= 3.15; the same lock
 * over NFS) are used where they exist: a classic F_SETLK lock is dropped
 * when the process closes ANY descriptor of the file, OFD locks only when
 * this descriptor closes. The kernel (or the NFS server, when a client
 * node dies: after its lease, 90 s by default on NFSv4) releases the lock
 * of a process that has ended, so "the lock is free" is exactly "the holder
 * is gone": a stale file left by a killed job is taken over, and a holder
 * still running is never. */
#ifdef F_OFD_SETLK
#define LOCK_CMD F_OFD_SETLK
#else
#define LOCK_CMD F_SETLK
#endif

/* "host=H job=J pid=P" of this process into buf. */
static void lock_identity(char *buf, size_t len)
{
    char host[256] = "?";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    const char *jobid = getenv("SLURM_JOB_ID");
    snprintf(buf, len, "host=%s job=%s pid=%ld", host, jobid && *jobid ? jobid : "-",
             (long)getpid());
}

/* The first line of the lock file (its holder), "" when empty or unreadable. */
static void lock_read_holder(int fd, char *buf, size_t len)
{
    ssize_t n = pread(fd, buf, len - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    buf[strcspn(buf, "\n")] = 0;
}

/* Take the run-directory lock of dir: *fd_out gets the locked descriptor
 * (kept open until ch_job_finalize). Errors: CH_ERR_INVALID "'dir' is in use
 * by another run: host=... job=... pid=... holds ..." when a live process
 * holds it (refused at once, nothing in dir is touched); CH_ERR_UNSUPPORTED
 * when the file system has no POSIX locks (the caller goes on without the
 * lock, warned); CH_ERR_IO naming the file. */
static ch_status lock_output_dir(const char *dir, int *fd_out, int *created)
{
    *fd_out = -1;
    *created = 0;
    char path[4200];
    size_t dl = strlen(dir);
    const char *sep = dl > 0 && dir[dl - 1] == '/' ? "" : "/"; /* no "dir//cohort.lock" */
    if ((size_t)snprintf(path, sizeof path, "%s%s%s", dir, sep, LOCK_FILE_NAME) >= sizeof path)
        return CH_ERROR(CH_ERR_INVALID, "'%s': path too long", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) *created = 1;
    else if (errno == EEXIST) fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return CH_ERROR(CH_ERR_IO, "cannot open lock file '%s': %s", path, strerror(errno));
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET; /* l_start = l_len = 0: the whole file; l_pid 0 (OFD) */
    char holder[512];
    if (fcntl(fd, LOCK_CMD, &fl) != 0) {
        int e = errno;
        lock_read_holder(fd, holder, sizeof holder);
        close(fd);
        if (*created) (void)unlink(path);
        *created = 0;
        if (e == EAGAIN || e == EACCES)
            return CH_ERROR(CH_ERR_INVALID,
                            "'%s' is in use by another run: %s holds its lock %s (two runs "
                            "in one directory would overwrite each other's checkpoints); "
                            "wait for it to end, cancel it, or choose another directory",
                            dir, *holder ? holder : "(a process that has not written its "
                            "name yet)", path);
        if (e == ENOSYS || e == EOPNOTSUPP || e == ENOLCK || e == EINVAL)
            return CH_ERROR(CH_ERR_UNSUPPORTED,
                            "cannot lock '%s': %s (the file system has no POSIX locks; on "
                            "Lustre it needs the mount option -o flock)", path, strerror(e));
        return CH_ERROR(CH_ERR_IO, "cannot lock '%s': %s", path, strerror(e));
    }
    /* Ours. A name left in the file is a holder that has ended without
     * clearing it (killed, node lost): its lock is gone, so is it. */
    lock_read_holder(fd, holder, sizeof holder);
    if (*holder) ch_log_info("run directory lock %s: taking it over from %s, which has ended", path,
                             holder);
    char me[512];
    lock_identity(me, sizeof me);
    size_t n = strlen(me);
    me[n++] = '\n';
    if (ftruncate(fd, 0) != 0 || pwrite(fd, me, n, 0) != (ssize_t)n || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return CH_ERROR(CH_ERR_IO, "cannot write lock file '%s': %s", path, strerror(e));
    }
    *fd_out = fd;
    return CH_OK;
}

/* Release: the holder's name is cleared (an empty file is a free lock),
 * then the descriptor closed, which drops the lock. */
static void unlock_output_dir(int fd)
{
    if (fd < 0) return;
    if (ftruncate(fd, 0) != 0) ch_log_warn("run directory lock: clearing it: %s", strerror(errno));
    close(fd);
}

/* ------------------------------------------------------------------ init */

static int has_key(const ch_config_t *cfg, const char *name)
{
    return ch_config_source(cfg, name) != NULL;
}

static const char *thread_level_name(int level)
{
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    }
    return "?";
}

/* Runtime keys: the device rule, the warning signal, requeue. Config
 * errors (CH_ERR_CONFIG / CH_ERR_INVALID naming key and source). */
static ch_status read_runtime_keys(ch_job_t *job, const ch_job_options_t *opt,
                                   ch_device_rule *rule)
{
    ch_config_t *c = job->cfg;
    *rule = CH_DEVICE_RULE_AUTO;
    if (opt->compute) {
        const char *text;
        CH_TRY(ch_config_get_string(c, "dist.device_rule", &text));
        if (ch_device_rule_parse(text, rule) != CH_OK)
            return ch_error_context("%s: dist.device_rule", ch_config_source(c, "dist.device_rule"));
    }
    if (opt->preemption) {
        const char *text;
        CH_TRY(ch_config_get_string(c, "dist.warning_signal", &text));
        if (ch_signal_parse(text, &job->warning_signal) != CH_OK)
            return ch_error_context("%s: dist.warning_signal",
                                    ch_config_source(c, "dist.warning_signal"));
    }
    if (has_key(c, "dist.requeue")) CH_TRY(ch_config_get_bool(c, "dist.requeue", &job->requeue));
    if (has_key(c, "dist.timeout")) CH_TRY(ch_config_get_double(c, "dist.timeout", &job->timeout));
    if (opt->output_dir_key) CH_TRY(ch_config_get_string(c, opt->output_dir_key, &job->out_dir));
    return CH_OK;
}

/* Device rule, per-node duplicate check, all-or-none GPUs, the compute
 * backend and NCCL. Returns CH_JOB_CONTINUE or an exit code. */
static int setup_compute(ch_job_t *job, const ch_job_options_t *opt, ch_device_rule rule)
{
    ch_status s;
    int ndev = 0;
    s = ch_device_count(&ndev);
    if (s == CH_OK) s = ch_env_choose_device(&job->env, rule, ndev);
    /* every rank takes part, also one whose own choice failed */
    s = ch_env_check_devices_status(&job->env, s, MPI_COMM_WORLD);
    if (ch_job_agree(job, s, "device selection")) return CH_EXIT_BAD_INPUT;

    /* GPU ranks: all or none (the gradient collectives are NCCL or MPI for
     * the whole world) */
    job->on_gpu = job->env.device >= 0;
    ch_compute_options_t co;
    int mine[2] = {job->on_gpu, -job->on_gpu}, red[2] = {job->on_gpu, -job->on_gpu};
    s = CH_OK;
    if (job->world > 1 &&
        MPI_Allreduce(mine, red, 2, MPI_INT, MPI_MIN, job_comm(job)) != MPI_SUCCESS)
        s = CH_ERROR(CH_ERR_MPI, "MPI_Allreduce of the GPU flags failed");
    else if (red[0] != -red[1])
        s = CH_ERROR(CH_ERR_INVALID, "some ranks have a GPU and others do not (this rank: %s); "
                     "run every rank on GPUs or every rank on CPUs",
                     job->on_gpu ? "GPU" : "no GPU");
    ch_compute_options_default(&co);
    if (s == CH_OK &&
        (has_key(job->cfg, "compute.bf16") || has_key(job->cfg, "compute.precision")))
        s = ch_compute_from_config(job->cfg, &co);
    if (s == CH_OK && opt->threads_key)
        s = ch_config_get_int(job->cfg, opt->threads_key, &co.num_threads);
    /* bf16 on CPU ranks: oneDNN's bf16 kernels, which need an ISA with bf16
     * (after ONEDNN_MAX_CPU_ISA) */
    if (s == CH_OK && co.bf16 && !job->on_gpu && !ch_compute_cpu_has_bf16())
        s = CH_ERROR(CH_ERR_CONFIG, "compute.precision = bf16: this CPU's oneDNN ISA is %s (no "
                     "bf16 instructions); use fp32", ch_compute_cpu_isa());
    if (s == CH_OK && job->on_gpu) s = ch_device_set(job->env.device);
    if (ch_job_agree(job, s, "compute device")) return CH_EXIT_BAD_INPUT;

    co.gpu_device = job->on_gpu ? job->env.device : -1;
    s = ch_compute_create(&co, &job->cx);
    /* GPU state now (streams, handles), so failures show up here */
    if (s == CH_OK && job->on_gpu) {
        ch_error_clear();
        if (!ch_compute_stream(job->cx, CH_DEV_CUDA))
            s = ch_error_code() != CH_OK
                    ? ch_error_context("GPU %d: setting up the compute backend", job->env.device)
                    : CH_ERROR(CH_ERR_CUDA, "GPU %d: the compute backend could not set up its "
                               "streams and handles", job->env.device);
    }
    if (ch_job_agree(job, s, "compute backend")) return CH_EXIT_ERROR;
    if (job->on_gpu) {
        /* NCCL over the MPI world for gradients and SyncBN; a failure may
         * leave peers inside ncclCommInitRank, so it is fatal */
        ch_check_fatal(ch_pg_create_nccl(job->pg, job->env.device, &job->nccl),
                       "NCCL process group");
        s = ch_pg_nccl_set_stream(job->nccl, ch_compute_stream(job->cx, CH_DEV_CUDA));
        if (ch_job_agree(job, s, "NCCL compute stream")) return CH_EXIT_ERROR;
    }
    return CH_JOB_CONTINUE;
}

/* Rank 0 creates and probes the output directory, takes its lock (refused
 * when another live run holds it) and, holding it, removes stale temporary
 * files: with the lock held no other cohort process writes there, so every
 * temporary file found is a dead writer's. */
static int setup_output_dir(ch_job_t *job, const ch_job_options_t *opt)
{
    ch_status s = CH_OK;
    size_t len = strlen(job->out_dir) + sizeof "/" STOP_FILE_NAME;
    job->stop_file = malloc(len);
    if (!job->stop_file) s = CH_ERROR(CH_ERR_NOMEM, "out of memory");
    else snprintf(job->stop_file, len, "%s/%s", job->out_dir, STOP_FILE_NAME);
    if (s == CH_OK && job->rank == 0) {
        s = make_dirs(job->out_dir, &job->made_dirs, &job->n_made_dirs);
        if (s == CH_OK) s = probe_output_dir(job->out_dir);
        if (s == CH_OK) {
            s = lock_output_dir(job->out_dir, &job->lock_fd, &job->made_lock);
            if (s == CH_ERR_UNSUPPORTED) {
                /* a file system without locks: run unprotected rather than
                 * not at all, and leave temporary files alone (their writer
                 * may be another live run) */
                ch_log_warn("%s; running without the run-directory lock, stale temporary "
                            "files are not removed", ch_error_message());
                s = CH_OK;
            } else if (s == CH_OK) {
                s = remove_stale_temps(job->out_dir);
            }
        }
        if (s) ch_error_context("%s", opt->output_dir_key);
    }
    if (ch_job_agree(job, s, "output directory")) return CH_EXIT_BAD_INPUT;
    return CH_JOB_CONTINUE;
}

/* COHORT_TEST_HOLD=KIND:N:DIR (a test hook, see ch_job_test_hold): unset
 * or empty leaves hold_kind NULL. KIND is letters and '_', N a
 * non-negative integer, DIR an existing directory. */
static ch_status read_test_hold(ch_job_t *job)
{
    const char *v = getenv("COHORT_TEST_HOLD");
    if (!v || !*v) return CH_OK;
    const char *c1 = strchr(v, ':');
    const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    int ok = c1 && c2 && c1 > v && c2 > c1 + 1 && c2[1];
    for (const char *p = v; ok && p < c1; p++) ok = (*p >= 'a' && *p <= 'z') || *p == '_';
    for (const char *p = c1 ? c1 + 1 : v; ok && p < c2; p++) ok = *p >= '0' && *p <= '9';
    struct stat st;
    if (ok) ok = stat(c2 + 1, &st) == 0 && S_ISDIR(st.st_mode);
    if (!ok)
        return CH_ERROR(CH_ERR_INVALID, "COHORT_TEST_HOLD: '%s': expected KIND:N:DIR (e.g. "
                        "step:33:/tmp/hold, DIR an existing directory)", v);
    job->hold_kind = strndup(v, (size_t)(c1 - v));
    job->hold_dir = strdup(c2 + 1);
    job->hold_n = strtoll(c1 + 1, NULL, 10);
    if (!job->hold_kind || !job->hold_dir) return CH_ERROR(CH_ERR_NOMEM, "COHORT_TEST_HOLD");
    return CH_OK;
}

/* DIR/NAME.RANK created (contents: text, may be ""); errors only logged. */
static void hold_mark(ch_job_t *job, const char *name, const char *text)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s.%d", job->hold_dir, name, job->rank);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) == EOF || fclose(f) != 0)
        ch_log_warn("COHORT_TEST_HOLD: cannot write %s (%s)", path, strerror(errno));
}

void ch_job_test_hold(ch_job_t *job, const char *kind, long long n)
{
    if (!job || !job->hold_kind || job->hold_done || n != job->hold_n ||
        strcmp(kind, job->hold_kind) != 0)
        return;
    job->hold_done = 1;
    char release[PATH_MAX];
    snprintf(release, sizeof release, "%s/release", job->hold_dir);
    ch_log_debug("COHORT_TEST_HOLD: held at %s %lld until %s exists", kind, n, release);
    hold_mark(job, "held", "");
    int marked = 0;
    while (access(release, F_OK) != 0) {
        int sig = ch_preempt_pending();
        if (sig && !marked) {
            char text[16];
            snprintf(text, sizeof text, "%d\n", sig);
            hold_mark(job, "signal", text);
            marked = 1;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ch_log_debug("COHORT_TEST_HOLD: released at %s %lld", kind, n);
}

static int init_steps(ch_job_t *job, const ch_job_options_t *opt, int argc, char **argv)
{
    ch_status s;
    /* 1. MPI */
    int inited = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(&argc, &argv, opt->mpi_thread_level, &provided) != MPI_SUCCESS) {
            fprintf(stderr, "%s: MPI_Init_thread failed\n", job->name);
            return CH_EXIT_ERROR;
        }
        job->mpi_started = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &job->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &job->world);
    ch_log_set_rank(job->rank, job->world);
    job->is_tty = isatty(STDERR_FILENO);

    /* 3 (first, so every later verdict has its group). The MPI process group. */
    s = ch_pg_create_mpi(MPI_COMM_WORLD, &job->pg);
    if (s) {
        /* no group to agree over: each rank says it (all fail alike) */
        fprintf(stderr, "%s: rank %d: process group: %s\n", job->name, job->rank,
                ch_error_message());
        return CH_EXIT_ERROR;
    }
    s = CH_OK;
    if (provided < opt->mpi_thread_level)
        s = CH_ERROR(CH_ERR_MPI, "MPI gives thread level %s, the job needs %s",
                     thread_level_name(provided), thread_level_name(opt->mpi_thread_level));
    if (ch_job_agree(job, s, "MPI")) return CH_EXIT_ERROR;

    /* 2. identity and launch checks; rank and world stay MPI's (the same
     * under MPI; a mismatch with the launcher is refused here) */
    ch_env_options_t eo = {.needs_mpi_collectives = 1, .device_rule = CH_DEVICE_RULE_AUTO,
                           .identity_only = 1, .quiet = 1};
    s = ch_env_discover(&eo, &job->env);
    job->env_ok = s == CH_OK;
    ch_log_set_rank(job->rank, job->world);
    if (ch_job_agree(job, s, NULL)) return CH_EXIT_BAD_INPUT;

    /* 4. configuration (prints --help on rank 0) */
    s = ch_config_load_tables(opt->tables, opt->n_tables, opt->summary, argc, argv, &job->cfg);
    if (s == CH_OK && ch_config_help_requested(job->cfg)) return CH_EXIT_OK;
    ch_device_rule rule = CH_DEVICE_RULE_AUTO;
    if (s == CH_OK) s = read_runtime_keys(job, opt, &rule);
    if (s == CH_OK) s = read_test_hold(job);
    if (s == CH_OK && opt->check_config) s = opt->check_config(job->cfg);
    if (ch_job_agree(job, s, NULL)) return CH_EXIT_BAD_INPUT;
    /* the preemption handlers as soon as the signal is known: a preemption
     * during the device, NCCL and output-directory setup (seconds on GPUs)
     * is then a stop at the first step, not a death by the signal */
    if (opt->preemption) {
        s = ch_preempt_install(job->warning_signal);
        if (ch_job_agree(job, s, "signal handlers")) return CH_EXIT_ERROR;
    }
    if (!opt->no_identity_line) ch_log_info("%s", job->env.note);
    /* COHORT_LOG_LEVEL=debug: every rank states who it is (and what Slurm
     * told it), to check a launch */
    {
        const char *procid = getenv("SLURM_PROCID"), *ntasks = getenv("SLURM_NTASKS");
        ch_log_debug("identity: %s; node %s; SLURM_PROCID %s, SLURM_NTASKS %s", job->env.note,
                     job->env.node_name, procid ? procid : "-", ntasks ? ntasks : "-");
    }

    /* 5. device, compute backend, NCCL */
    if (opt->compute) {
        int rc = setup_compute(job, opt, rule);
        if (rc != CH_JOB_CONTINUE) return rc;
    }

    /* 6. output directory */
    if (opt->output_dir_key) {
        int rc = setup_output_dir(job, opt);
        if (rc != CH_JOB_CONTINUE) return rc;
    }

    /* 7. profiler */
    s = CH_OK;
    if (opt->n_phases > 0) s = ch_prof_create(opt->phase_names, opt->n_phases, &job->prof);
    if (ch_job_agree(job, s, "profiler")) return CH_EXIT_ERROR;
    return CH_JOB_CONTINUE;
}

int ch_job_init(const ch_job_options_t *opt, int argc, char **argv, ch_job_t **out)
{
    if (!out) return CH_EXIT_ERROR;
    *out = NULL;
    ch_job_t *job = calloc(1, sizeof *job);
    if (!job) {
        fprintf(stderr, "%s: out of memory starting the job\n",
                opt && opt->name ? opt->name : "cohort");
        return CH_EXIT_ERROR;
    }
    *out = job;
    job->lock_fd = -1;
    pthread_mutex_init(&job->beat_mu, NULL);
    pthread_cond_init(&job->beat_cv, NULL);
    snprintf(job->name, sizeof job->name, "%s", opt && opt->name ? opt->name : "cohort");
    if (!opt || (opt->n_tables > 0 && !opt->tables) || opt->n_tables < 0 ||
        (opt->n_phases > 0 && !opt->phase_names)) {
        fprintf(stderr, "%s: ch_job_init: bad options (NULL options, tables or phase names)\n",
                job->name);
        return CH_EXIT_ERROR;
    }
    int rc = init_steps(job, opt, argc, argv);
    if (rc == CH_JOB_CONTINUE) job->running = 1;
    return rc;
}

/* ------------------------------------------------------------------ stop */

int ch_job_stop_local(ch_job_t *job, int local_reasons)
{
    if (!job) return local_reasons;
    int r = local_reasons;
    if (ch_preempt_pending()) r |= CH_STOP_PREEMPT;
    if (job->stop_requested) r |= CH_STOP_REQUESTED;
    if (job->rank == 0 && job->stop_file && access(job->stop_file, F_OK) == 0) {
        r |= CH_STOP_FILE;
        /* renamed to STOPPED: gone, so that a resumed run does not stop at
         * its first step, and there for the batch script, which must not
         * requeue a run its user stopped */
        size_t len = strlen(job->stop_file) + sizeof STOPPED_FILE_NAME;
        char *done = malloc(len);
        if (done) {
            snprintf(done, len, "%s/%s", job->out_dir, STOPPED_FILE_NAME);
            if (rename(job->stop_file, done) == 0)
                ch_log_info("stop file %s found (renamed to %s): stopping", job->stop_file, done);
            else
                ch_log_warn("stop file %s found but not renamed to %s (%s): stopping",
                            job->stop_file, done, strerror(errno));
            free(done);
        } else {
            ch_log_warn("stop file %s found (out of memory renaming it): stopping", job->stop_file);
        }
    }
    return r;
}

void ch_job_stop_set(ch_job_t *job, int agreed_reasons)
{
    if (!job) return;
    job->stop_reasons = agreed_reasons;
    if (agreed_reasons & CH_STOP_PREEMPT) {
        int sig = ch_preempt_pending();
        if (sig > job->stop_signal) job->stop_signal = sig;
    }
}

/* Reason bits as separate ints so one MAX all-reduce gives both their OR
 * and the highest signal number. */
#define N_STOP_BITS 5

int ch_job_stop_agree(ch_job_t *job, int local_reasons)
{
    if (!job) return local_reasons;
    if (job->peer_lost) {
        job->stop_reasons |= CH_STOP_PEER_LOST;
        return job->stop_reasons;
    }
    int local = ch_job_stop_local(job, local_reasons);
    int v[N_STOP_BITS + 1], all[N_STOP_BITS + 1];
    for (int b = 0; b < N_STOP_BITS; b++) v[b] = (local >> b) & 1;
    v[N_STOP_BITS] = ch_preempt_pending();
    memcpy(all, v, sizeof all);
    if (job->world > 1) {
        int rc = MPI_Allreduce(v, all, N_STOP_BITS + 1, MPI_INT, MPI_MAX, job_comm(job));
        if (rc != MPI_SUCCESS) {
            report_peer_lost(job, "the stop-flag agreement", rc);
            job->stop_reasons |= CH_STOP_PEER_LOST;
            return job->stop_reasons;
        }
    }
    int reasons = 0;
    for (int b = 0; b < N_STOP_BITS; b++) reasons |= all[b] << b;
    job->stop_reasons = reasons;
    if (all[N_STOP_BITS] > job->stop_signal) job->stop_signal = all[N_STOP_BITS];
    return reasons;
}

/* ------------------------------------------------------------------ watchdog */

static double monotonic_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The watchdog thread: wakes every second (or at a beat) and ends the
 * process when no beat came for job->timeout seconds. A rank whose peer
 * died may wait in a collective forever (MPICH over UCX does not report a
 * killed peer; srun by default and mpiexec -disable-auto-cleanup leave the
 * survivors running): this is the one exit that does not need the peer.
 * It only uses write(2) and _exit: the main thread is stuck in MPI. */
static void *watchdog_main(void *arg)
{
    ch_job_t *job = arg;
    pthread_mutex_lock(&job->beat_mu);
    while (!job->watchdog_quit) {
        double idle = monotonic_now() - job->last_beat;
        if (idle > job->timeout) {
            char line[512];
            int n = job->tearing_down
                        ? snprintf(line, sizeof line, "%s: rank %d: teardown (profile table, "
                                   "cleanups, process groups: an NCCL communicator's stream or "
                                   "an MPI free waiting on a peer) not done after %.0f s "
                                   "(dist.timeout = %g): a peer rank is gone or hung; ending "
                                   "this rank (exit %d)\n", job->name, job->rank, idle,
                                   job->timeout, CH_EXIT_PEER_LOST)
                        : snprintf(line, sizeof line, "%s: rank %d: no step boundary for %.0f s "
                                   "(dist.timeout = %g): a peer rank is gone or hung; ending "
                                   "this rank (exit %d)\n", job->name, job->rank, idle,
                                   job->timeout, CH_EXIT_PEER_LOST);
            if (n > 0) {
                ssize_t w = write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
                (void)w;
            }
            _exit(CH_EXIT_PEER_LOST);
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&job->beat_cv, &job->beat_mu, &until);
    }
    pthread_mutex_unlock(&job->beat_mu);
    return NULL;
}

void ch_job_heartbeat(ch_job_t *job)
{
    if (!job || job->timeout <= 0) return;
    pthread_mutex_lock(&job->beat_mu);
    job->last_beat = monotonic_now();
    if (!job->watchdog_started) {
        /* the thread takes no signal: preemption signals go to the main thread */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        if (pthread_create(&job->watchdog, NULL, watchdog_main, job) == 0)
            job->watchdog_started = 1;
        else
            ch_log_warn("dist.timeout: the watchdog thread could not start: no timeout");
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (!job->watchdog_started) job->timeout = 0;
    }
    pthread_mutex_unlock(&job->beat_mu);
}

static void watchdog_stop(ch_job_t *job)
{
    pthread_mutex_lock(&job->beat_mu);
    int started = job->watchdog_started;
    job->watchdog_quit = 1;
    pthread_cond_signal(&job->beat_cv);
    pthread_mutex_unlock(&job->beat_mu);
    if (started) pthread_join(job->watchdog, NULL);
    pthread_mutex_destroy(&job->beat_mu);
    pthread_cond_destroy(&job->beat_cv);
}

void ch_job_request_stop(ch_job_t *job)
{
    if (job) job->stop_requested = 1;
}

int ch_job_stop_reasons(const ch_job_t *job) { return job ? job->stop_reasons : 0; }
int ch_job_stop_signal(const ch_job_t *job) { return job ? job->stop_signal : 0; }

/* ------------------------------------------------------------------ requeue */

void ch_job_requeue(ch_job_t *job)
{
    if (!job || !job->requeue || job->rank != 0) return;
    const char *id = getenv("SLURM_JOB_ID");
    if (!id || !*id) {
        ch_log_warn("dist.requeue: SLURM_JOB_ID is not set, not requeueing");
        return;
    }
    for (const char *p = id; *p; p++)
        if (*p < '0' || *p > '9') {
            ch_log_warn("dist.requeue: SLURM_JOB_ID '%s' is not a number", id);
            return;
        }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "scontrol requeue %s", id);
    int rc = system(cmd);
    if (rc) ch_log_warn("dist.requeue: '%s' failed (status %d)", cmd, rc);
    else ch_log_info("requeued job %s", id);
}

/* ------------------------------------------------------------------ progress */

void ch_job_progress(ch_job_t *job, const char *what, int64_t done, int64_t total, int every,
                     const char *text)
{
    if (!job || job->rank != 0) return;
    if (!what) what = "";
    if (!text) text = "";
    double t = now_s();
    if (strncmp(job->progress_what, what, sizeof job->progress_what - 1) ||
        done < job->progress_last) {
        /* a new phase: its clock starts here */
        if (job->progress_open) fputc('\n', stderr);
        job->progress_open = 0;
        snprintf(job->progress_what, sizeof job->progress_what, "%s", what);
        job->progress_t0 = t;
        job->progress_done0 = done;
    }
    job->progress_last = done;
    double elapsed = t - job->progress_t0;
    int64_t since = done - job->progress_done0;
    double eta = since > 0 && total > done ? elapsed / (double)since * (double)(total - done) : 0;
    int final = total > 0 && done >= total;
    if (job->is_tty) {
        enum { WIDTH = 30 };
        int filled = total > 0 ? (int)(WIDTH * (done < total ? done : total) / total) : WIDTH;
        char bar[WIDTH + 1];
        for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
        bar[WIDTH] = 0;
        fprintf(stderr, "\r%s [%s] %lld/%lld  ETA %.0fs%s%s%s", what, bar, (long long)done,
                (long long)total, eta, *text ? "  " : "", text, final ? "\n" : "");
        job->progress_open = !final;
        fflush(stderr);
    } else if (final || (every > 0 && done % every == 0)) {
        fprintf(stderr, "%s %lld/%lld  ETA %.0fs%s%s\n", what, (long long)done, (long long)total,
                eta, *text ? "  " : "", text);
        fflush(stderr);
    }
}

/* ------------------------------------------------------------------ finalize */

ch_status ch_job_on_finalize(ch_job_t *job, void (*fn)(void *arg), void *arg)
{
    CH_REQUIRE(job != NULL && fn != NULL, "ch_job_on_finalize: NULL job or function");
    if (job->n_cleanups == job->cap_cleanups) {
        int nc = job->cap_cleanups ? 2 * job->cap_cleanups : 8;
        cleanup_t *c = realloc(job->cleanups, (size_t)nc * sizeof *c);
        if (!c) return CH_ERROR(CH_ERR_NOMEM, "ch_job_on_finalize: out of memory");
        job->cleanups = c;
        job->cap_cleanups = nc;
    }
    job->cleanups[job->n_cleanups].fn = fn;
    job->cleanups[job->n_cleanups].arg = arg;
    job->n_cleanups++;
    return CH_OK;
}

int ch_job_finalize(ch_job_t *job, int exit_code)
{
    if (!job) return CH_EXIT_ERROR;
    /* The teardown runs under the watchdog too, with a fresh dist.timeout:
     * destroying an NCCL group waits for its comm stream to drain (and an
     * MPI free or the profile table for the peers), which a dead or hung
     * peer never lets happen. */
    if (job->timeout > 0) {
        ch_job_heartbeat(job);
        pthread_mutex_lock(&job->beat_mu);
        job->tearing_down = 1;
        pthread_mutex_unlock(&job->beat_mu);
    }
    if (job->peer_lost) exit_code = CH_EXIT_PEER_LOST;
    if (job->progress_open) fputc('\n', stderr);
    /* the profile table is a collective over the world: only when every
     * rank is here (past init, no rank lost) */
    if (job->running && job->prof && !job->peer_lost) {
        fflush(stdout);
        if (ch_prof_report(job->prof, MPI_COMM_WORLD, stdout) != CH_OK)
            ch_log_warn("profile table: %s", ch_error_message());
    }
    for (int i = job->n_cleanups - 1; i >= 0; i--) job->cleanups[i].fn(job->cleanups[i].arg);
    free(job->cleanups);
    /* The preemption handlers stay installed (they only set a flag): a
     * warning signal that arrives during the final teardown must not kill a
     * job that has finished its work. */
    ch_compute_destroy(job->cx);
    ch_prof_destroy(job->prof);
    if (!job->peer_lost) {
        /* collective frees; after a lost peer they could block */
        ch_pg_destroy(job->nccl);
        ch_pg_destroy(job->pg);
    }
    watchdog_stop(job);
    if (exit_code == CH_EXIT_BAD_INPUT) {
        /* bad input found before any work: the lock file this run made
         * goes, and so do the directories it made (the run directory and
         * any parents mkdir -p made, deepest first; rmdir leaves a
         * directory that anything else was written to). A directory that
         * was there before keeps what it had, and gets nothing. */
        int lock_gone = 1;
        if (job->lock_fd >= 0) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s", job->out_dir, LOCK_FILE_NAME);
            unlock_output_dir(job->lock_fd);
            job->lock_fd = -1;
            lock_gone = !job->made_lock || unlink(path) == 0;
        }
        if (lock_gone) {
            remove_made_dirs(job->made_dirs, job->n_made_dirs);
            job->made_dirs = NULL;
            job->n_made_dirs = 0;
        }
    }
    for (int i = 0; i < job->n_made_dirs; i++) free(job->made_dirs[i]);
    free(job->made_dirs);
    ch_config_destroy(job->cfg);
    if (job->env_ok) ch_env_finalize(&job->env);
    free(job->stop_file);
    free(job->hold_kind);
    free(job->hold_dir);
    unlock_output_dir(job->lock_fd);
    const int started = job->mpi_started, lost = job->peer_lost;
    free(job);
    fflush(stdout);
    fflush(stderr);
    /* After a lost peer MPI_Finalize (and MPI_Comm_free) may wait for it
     * forever: the process ends here, without them; the launcher sees the
     * exit code. (_exit: what MPI holds is not freed, by design.) */
    if (lost) _exit(exit_code);
    if (started) MPI_Finalize();
    return exit_code;
}

/* ------------------------------------------------------------------ accessors */

int ch_job_rank(const ch_job_t *job) { return job ? job->rank : 0; }
int ch_job_world_size(const ch_job_t *job) { return job ? job->world : 1; }
int ch_job_local_rank(const ch_job_t *job) { return job ? job->env.local_rank : -1; }
const ch_env_t *ch_job_env(const ch_job_t *job) { return job ? &job->env : NULL; }
const char *ch_job_name(const ch_job_t *job) { return job ? job->name : "cohort"; }
ch_config_t *ch_job_config(const ch_job_t *job) { return job ? job->cfg : NULL; }
ch_pg_t *ch_job_pg(const ch_job_t *job) { return job ? job->pg : NULL; }
ch_pg_t *ch_job_nccl(const ch_job_t *job) { return job ? job->nccl : NULL; }
ch_compute_t *ch_job_compute(const ch_job_t *job) { return job ? job->cx : NULL; }
int ch_job_on_gpu(const ch_job_t *job) { return job ? job->on_gpu : 0; }
ch_prof_t *ch_job_profiler(const ch_job_t *job) { return job ? job->prof : NULL; }
const char *ch_job_output_dir(const ch_job_t *job) { return job ? job->out_dir : NULL; }
int ch_job_peer_lost(const ch_job_t *job) { return job ? job->peer_lost : 0; }
