/* Tests for framework/ops/cuda/order_plan (host-side rules of the CUDA
 * backend, issue #25), on any machine: which cuDNN convolution algorithms
 * compute.deterministic and a timed FMA search let run, and the upload
 * bookkeeping that keeps an async batch upload from overwriting a slot the
 * compute stream may still read (the double-buffered pattern of
 * io/data/batch_feed.c, a first upload, a slot reused without a wait, an
 * overlap, a full table). */
#include "config.h"

#include "tests/harness.h"

#include "framework/ops/cuda/order_plan.h"

#include <string.h>

static void test_conv_refusal(void **state)
{
    (void)state;
    /* default: anything goes */
    assert_null(ch_gp_conv_algo_refusal(0, 0, 0, 0, 0));
    assert_null(ch_gp_conv_algo_refusal(0, 0, 1, 0, 0));
    /* compute.deterministic: non-deterministic entries are passed over,
     * in heuristic and timed rankings alike */
    assert_string_equal(ch_gp_conv_algo_refusal(1, 0, 0, 0, 0), "not deterministic");
    assert_string_equal(ch_gp_conv_algo_refusal(1, 0, 1, 1, 1), "not deterministic");
    assert_null(ch_gp_conv_algo_refusal(1, 1, 0, 0, 0));
    assert_null(ch_gp_conv_algo_refusal(1, 1, 1, 1, 1));
    /* a timed search that will run FMA ranks only FMA timings */
    assert_string_equal(ch_gp_conv_algo_refusal(0, 1, 1, 1, 0),
                        "timed with tensor-op math, runs with FMA");
    assert_null(ch_gp_conv_algo_refusal(0, 1, 1, 1, 1));
    /* heuristics are no timings: kept (the run pins FMA) */
    assert_null(ch_gp_conv_algo_refusal(0, 1, 0, 1, 0));
    /* TF32 / bf16 runs use the reported math type: kept */
    assert_null(ch_gp_conv_algo_refusal(0, 1, 1, 0, 0));
}

/* io/data/batch_feed.c: slots A and B alternate; wait_upload between. */
static void test_upload_double_buffer(void **state)
{
    (void)state;
    ch_gp_upload_tracker_t t;
    memset(&t, 0, sizeof t);
    static char A[4096], B[4096], LA[64], LB[64];
    int ea, eb, ela, elb, rec[CH_GP_UPLOAD_TRACK];
    /* first uploads: nothing known about earlier readers */
    assert_int_equal(ch_gp_upload_before(&t, A, sizeof A, &ea), CH_GP_WAIT_COMPUTE);
    assert_int_equal(ch_gp_upload_before(&t, LA, sizeof LA, &ela), CH_GP_WAIT_COMPUTE);
    assert_true(ea >= 0 && ela >= 0 && ea != ela);
    /* wait 1 (step 1 gets A): nothing to record yet */
    assert_int_equal(ch_gp_upload_at_wait(&t, rec), 0);
    /* prefetch into B during step 1 */
    assert_int_equal(ch_gp_upload_before(&t, B, sizeof B, &eb), CH_GP_WAIT_COMPUTE);
    assert_int_equal(ch_gp_upload_before(&t, LB, sizeof LB, &elb), CH_GP_WAIT_COMPUTE);
    /* wait 2 (step 2 gets B): step 1's reads of A are all queued now */
    int k = ch_gp_upload_at_wait(&t, rec);
    assert_int_equal(k, 2);
    assert_true((rec[0] == ea && rec[1] == ela) || (rec[0] == ela && rec[1] == ea));
    /* prefetch into A during step 2: waits for A's freed event only */
    int e = -1;
    assert_int_equal(ch_gp_upload_before(&t, A, sizeof A, &e), CH_GP_WAIT_FREED);
    assert_int_equal(e, ea);
    assert_int_equal(ch_gp_upload_before(&t, LA, sizeof LA, &e), CH_GP_WAIT_FREED);
    assert_int_equal(e, ela);
    /* a smaller last batch into the same slot is the same buffer */
    assert_int_equal(ch_gp_upload_before(&t, A, 100, &e), CH_GP_WAIT_NONE);
    assert_int_equal(e, ea);
    /* wait 3: B's freed events */
    k = ch_gp_upload_at_wait(&t, rec);
    assert_int_equal(k, 2);
    assert_int_equal(ch_gp_upload_before(&t, B, sizeof B, &e), CH_GP_WAIT_FREED);
    assert_int_equal(e, eb);
}

static void test_upload_no_wait_between(void **state)
{
    (void)state;
    ch_gp_upload_tracker_t t;
    memset(&t, 0, sizeof t);
    static char A[256];
    int e, rec[CH_GP_UPLOAD_TRACK];
    assert_int_equal(ch_gp_upload_before(&t, A, sizeof A, &e), CH_GP_WAIT_COMPUTE);
    /* a second copy before any wait: ordered on the copy stream */
    assert_int_equal(ch_gp_upload_before(&t, A, sizeof A, &e), CH_GP_WAIT_NONE);
    assert_int_equal(ch_gp_upload_at_wait(&t, rec), 0);
    /* handed to the compute stream, whose readers may still be queued:
     * re-uploading at once waits for everything queued */
    assert_int_equal(ch_gp_upload_before(&t, A, sizeof A, &e), CH_GP_WAIT_COMPUTE);
    /* a bigger upload into the same start is a new range: all of compute */
    assert_int_equal(ch_gp_upload_at_wait(&t, rec), 0);
    assert_int_equal(ch_gp_upload_at_wait(&t, rec), 1);
    assert_int_equal(ch_gp_upload_before(&t, A, sizeof A + 1, &e), CH_GP_WAIT_COMPUTE);
}

static void test_upload_overlap_and_full(void **state)
{
    (void)state;
    ch_gp_upload_tracker_t t;
    memset(&t, 0, sizeof t);
    static char buf[(CH_GP_UPLOAD_TRACK + 2) * 64];
    int e, rec[CH_GP_UPLOAD_TRACK];
    assert_int_equal(ch_gp_upload_before(&t, buf, 128, &e), CH_GP_WAIT_COMPUTE);
    assert_int_equal(ch_gp_upload_at_wait(&t, rec), 0);
    assert_int_equal(ch_gp_upload_at_wait(&t, rec), 1); /* now FREED */
    /* a range inside the tracked one is not it: all of compute */
    assert_int_equal(ch_gp_upload_before(&t, buf + 64, 64, &e), CH_GP_WAIT_COMPUTE);
    assert_true(e >= 0);
    /* the old entry was forgotten: the original range is new again */
    assert_int_equal(ch_gp_upload_before(&t, buf, 128, &e), CH_GP_WAIT_COMPUTE);
    /* fill the table with pending uploads: beyond it, untracked (-1) and
     * conservative */
    memset(&t, 0, sizeof t);
    for (int i = 0; i < CH_GP_UPLOAD_TRACK; i++) {
        assert_int_equal(ch_gp_upload_before(&t, buf + 64 * i, 64, &e), CH_GP_WAIT_COMPUTE);
        assert_int_equal(e, i);
    }
    assert_int_equal(ch_gp_upload_before(&t, buf + 64 * CH_GP_UPLOAD_TRACK, 64, &e),
                     CH_GP_WAIT_COMPUTE);
    assert_int_equal(e, -1);
    /* after two waits all are FREED and make room again */
    assert_int_equal(ch_gp_upload_at_wait(&t, rec), 0);
    assert_int_equal(ch_gp_upload_at_wait(&t, rec), CH_GP_UPLOAD_TRACK);
    assert_int_equal(ch_gp_upload_before(&t, buf + 64 * CH_GP_UPLOAD_TRACK, 64, &e),
                     CH_GP_WAIT_COMPUTE);
    assert_true(e >= 0);
    assert_int_equal(ch_gp_upload_before(&t, buf + 64 * (CH_GP_UPLOAD_TRACK - 1), 64, &e),
                     CH_GP_WAIT_FREED);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_refusal),
        cmocka_unit_test(test_upload_double_buffer),
        cmocka_unit_test(test_upload_no_wait_between),
        cmocka_unit_test(test_upload_overlap_and_full),
    };
    return ch_test_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
