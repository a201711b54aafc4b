/* One store per swap file under forced interleavings: a second thread's
 * open or close is held at a chosen point of taking or removing its file
 * (the store's test hook) while the main thread opens or closes another
 * store, then let go. After each, every open store must hold the very file
 * at the path, at most one store may be open, and a loser must not have
 * removed the winner's file. */
#include <pthread.h>

#include "swap_internal.h"
#include "swap_test_util.h"

/* ---- the gate: pauses one thread at one point ---- */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const char *point;
    pthread_t who;
    int armed, arrived, go;
} gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0, 0};

static void gate_hook(const char *point, const char *path)
{
    (void)path;
    pthread_mutex_lock(&gate.mu);
    if (gate.armed && pthread_equal(gate.who, pthread_self()) && !strcmp(point, gate.point)) {
        gate.armed = 0;
        gate.arrived = 1;
        pthread_cond_broadcast(&gate.cv);
        while (!gate.go)
            pthread_cond_wait(&gate.cv, &gate.mu);
    }
    pthread_mutex_unlock(&gate.mu);
}

/* A store operation run on its own thread, held at `point`. */
typedef struct held_op {
    pthread_t t;
    const char *point;
    zo_swap_config c;
    zo_swap_t s; /* OPEN: the store opened; CLOSE: the store to close */
    int closing;
    zo_status st;
    char err[512];
} held_op;

static void *held_run(void *arg)
{
    held_op *op = arg;
    pthread_mutex_lock(&gate.mu);
    gate.who = pthread_self();
    gate.point = op->point;
    gate.armed = 1;
    gate.arrived = gate.go = 0;
    pthread_mutex_unlock(&gate.mu);
    if (op->closing) {
        zo_swap_close(op->s);
        op->s = NULL;
        op->st = ZO_OK;
    } else {
        op->st = zo_swap_open(&op->c, &op->s);
        snprintf(op->err, sizeof op->err, "%s", op->st == ZO_OK ? "" : zo_last_error());
    }
    pthread_mutex_lock(&gate.mu);
    gate.armed = 0;
    gate.arrived = 1; /* also when the point was never reached */
    pthread_cond_broadcast(&gate.cv);
    pthread_mutex_unlock(&gate.mu);
    return NULL;
}

/* Start op and wait until it is held at its point (or finished). */
static void held_start(held_op *op)
{
    gate.arrived = 0;
    assert_int_equal(pthread_create(&op->t, NULL, held_run, op), 0);
    pthread_mutex_lock(&gate.mu);
    while (!gate.arrived)
        pthread_cond_wait(&gate.cv, &gate.mu);
    pthread_mutex_unlock(&gate.mu);
}

static void held_finish(held_op *op)
{
    pthread_mutex_lock(&gate.mu);
    gate.go = 1;
    pthread_cond_broadcast(&gate.cv);
    pthread_mutex_unlock(&gate.mu);
    pthread_join(op->t, NULL);
}

/* ---- invariants ---- */

static const char *file0(swap_test_fixture *f, char *p, size_t cap)
{
    snprintf(p, cap, "%s/zoffload.swap.0", f->dirs.paths[0]);
    return p;
}

/* s holds the file now at the path (not one removed from it). */
static void assert_holds_path(zo_swap_t s)
{
    struct stat a, b;
    assert_int_equal(fstat(s->files[0].fd, &a), 0);
    assert_int_equal(stat(s->files[0].path, &b), 0);
    assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
}

/* One more store on the directory is refused while s is open. */
static void assert_sole_holder(zo_swap_config *c, zo_swap_t s)
{
    assert_holds_path(s);
    zo_swap_t other = NULL;
    ZO_ASSERT_ST(zo_swap_open(c, &other), ZO_ERR_EXISTS);
    assert_null(other);
    assert_non_null(strstr(zo_last_error(), "in use"));
}

static zo_swap_config one_path(swap_test_fixture *f)
{
    zo_swap_config c = swap_test_config(&f->dirs, 1, 1 << 20, 256 << 10);
    c.reuse = ZO_SWAP_REUSE; /* what zo-train's engine asks for */
    return c;
}

static void leave_stale_file(zo_swap_config c)
{
    zo_swap_t s;
    c.keep_files = 1; /* what kill -9 leaves behind */
    ZO_ASSERT_OK(zo_swap_open(&c, &s));
    zo_swap_close(s);
}

/* ---- the interleavings ---- */

/* A creates the file and is held before locking it; B takes the empty file
 * over. A then fails, and must not remove B's file (before O_EXCL and
 * holder-only removal it unlinked it, and a third store started beside B). */
static void test_creator_held_before_lock(void **state)
{
    swap_test_fixture *f = *state;
    char p[700];
    held_op a = {.point = "created", .c = one_path(f)};
    held_start(&a);
    assert_int_equal(access(file0(f, p, sizeof p), F_OK), 0);
    zo_swap_t b = NULL;
    ZO_ASSERT_OK(zo_swap_open(&a.c, &b));
    held_finish(&a);
    assert_int_equal(a.st, ZO_ERR_EXISTS);
    assert_null(a.s);
    assert_int_equal(access(p, F_OK), 0);
    assert_sole_holder(&a.c, b);
    zo_swap_close(b);
    assert_int_equal(access(p, F_OK), -1);
}

/* B opens A's file and is held before locking it; A closes (removes the
 * file, unlocks). B's lock is then on a removed file: B must start over and
 * create a new one, so that C cannot start beside it. */
static void test_lock_won_on_removed_file(void **state)
{
    swap_test_fixture *f = *state;
    zo_swap_config c = one_path(f);
    zo_swap_t a;
    ZO_ASSERT_OK(zo_swap_open(&c, &a));
    held_op b = {.point = "opened", .c = c};
    held_start(&b);
    zo_swap_close(a);
    held_finish(&b);
    if (b.st != ZO_OK)
        fail_msg("B failed: %s", b.err);
    assert_sole_holder(&c, b.s);
    zo_swap_close(b.s);
}

/* Two stores find the same stale file; A is held before locking it, B takes
 * it over. A is refused (in use), B's file stays. */
static void test_two_take_over_one_stale_file(void **state)
{
    swap_test_fixture *f = *state;
    char p[700];
    zo_swap_config c = one_path(f);
    leave_stale_file(c);
    held_op a = {.point = "opened", .c = c};
    held_start(&a);
    zo_swap_t b = NULL;
    ZO_ASSERT_OK(zo_swap_open(&c, &b));
    held_finish(&a);
    assert_int_equal(a.st, ZO_ERR_EXISTS);
    assert_non_null(strstr(a.err, "in use"));
    assert_sole_holder(&c, b);
    zo_swap_close(b);
    assert_int_equal(access(file0(f, p, sizeof p), F_OK), -1);
}

/* A stale file is taken over by A, held after locking it: B is refused. */
static void test_taken_stale_file_is_held(void **state)
{
    swap_test_fixture *f = *state;
    zo_swap_config c = one_path(f);
    leave_stale_file(c);
    held_op a = {.point = "locked", .c = c};
    held_start(&a);
    zo_swap_t b = NULL;
    ZO_ASSERT_ST(zo_swap_open(&c, &b), ZO_ERR_EXISTS);
    held_finish(&a);
    if (a.st != ZO_OK)
        fail_msg("A failed: %s", a.err);
    assert_sole_holder(&c, a.s);
    zo_swap_close(a.s);
}

/* A's close is held while removing its file (before and after the unlink,
 * still holding the lock): B is refused before the unlink and creates a new
 * file after it, and A's close must leave B's file alone. */
static void test_holder_closing(void **state)
{
    swap_test_fixture *f = *state;
    char p[700];
    zo_swap_config c = one_path(f);
    const char *points[] = {"removing", "removed"};
    for (int i = 0; i < 2; i++) {
        held_op a = {.point = points[i], .closing = 1};
        ZO_ASSERT_OK(zo_swap_open(&c, &a.s));
        held_start(&a);
        zo_swap_t b = NULL;
        zo_status st = zo_swap_open(&c, &b);
        held_finish(&a);
        if (i == 0) {
            assert_int_equal(st, ZO_ERR_EXISTS);
            continue;
        }
        ZO_ASSERT_OK(st);
        assert_int_equal(access(file0(f, p, sizeof p), F_OK), 0);
        assert_sole_holder(&c, b);
        zo_swap_close(b);
    }
    assert_int_equal(access(file0(f, p, sizeof p), F_OK), -1);
}

/* A file that is not zoffload's is never taken over, whatever its lock. */
static void test_foreign_file_refused(void **state)
{
    swap_test_fixture *f = *state;
    char p[700];
    zo_swap_config c = one_path(f);
    FILE *fp = fopen(file0(f, p, sizeof p), "w");
    assert_non_null(fp);
    fputs("someone else's data", fp);
    fclose(fp);
    zo_swap_t s = NULL;
    ZO_ASSERT_ST(zo_swap_open(&c, &s), ZO_ERR_EXISTS);
    assert_non_null(strstr(zo_last_error(), "not a zoffload swap file"));
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_size, 19);
}

int main(void)
{
    swap_test_require_odirect();
    zo_swap_test_pause = gate_hook;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_creator_held_before_lock, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_lock_won_on_removed_file, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_two_take_over_one_stale_file, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_taken_stale_file_is_held, swap_test_setup,
                                        swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_holder_closing, swap_test_setup, swap_test_teardown),
        cmocka_unit_test_setup_teardown(test_foreign_file_refused, swap_test_setup,
                                        swap_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
