/* zo/file.h: a file a user names is opened without blocking and refused by
 * name when it is not the kind expected: a FIFO, a device, a directory for a
 * file to read; a directory or a FIFO nobody reads for a file to write; a
 * file for a directory. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zo/file.h"
#include "zo/status.h"
#include "zo_test.h"

static char g_dir[256];

static void path_in_dir(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static void expect_error(zo_status st, zo_status want, const char *needle)
{
    assert_int_equal(st, want);
    if (!strstr(zo_last_error(), needle))
        fail_msg("'%s' lacks '%s'", zo_last_error(), needle);
}

static void test_read_takes_regular_files_only(void **state)
{
    char path[300], fifo[300];
    path_in_dir(path, sizeof path, "a.txt");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("hello", f);
    fclose(f);
    int fd = -1;
    ZO_ASSERT_OK(zo_file_open_read(path, &fd));
    char buf[8] = {0};
    assert_int_equal(read(fd, buf, sizeof buf), 5); /* blocking again, reads as usual */
    assert_int_equal(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    close(fd);
    FILE *s = NULL;
    ZO_ASSERT_OK(zo_file_fopen_read(path, &s));
    assert_non_null(fgets(buf, sizeof buf, s));
    assert_string_equal(buf, "hello");
    fclose(s);

    path_in_dir(fifo, sizeof fifo, "fifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    expect_error(zo_file_open_read(fifo, &fd), ZO_ERR_INVALID_ARG,
                 "is a FIFO: expected a regular file to read");
    expect_error(zo_file_open_read(g_dir, &fd), ZO_ERR_INVALID_ARG,
                 "is a directory: expected a regular file to read");
    expect_error(zo_file_open_read("/dev/null", &fd), ZO_ERR_INVALID_ARG,
                 "'/dev/null' is a character device");
    path_in_dir(path, sizeof path, "missing");
    expect_error(zo_file_open_read(path, &fd), ZO_ERR_NOT_FOUND, "does not exist");
    assert_string_equal(zo_file_kind(fifo), "a FIFO");
    assert_string_equal(zo_file_kind(path), "missing");
    unlink(fifo);
}

static void test_write_refuses_what_would_block(void **state)
{
    char path[300], fifo[300], buf[16] = {0};
    path_in_dir(path, sizeof path, "out.txt");
    FILE *f = NULL;
    ZO_ASSERT_OK(zo_file_fopen_write(path, 0, &f));
    fputs("first", f);
    assert_int_equal(fclose(f), 0);
    ZO_ASSERT_OK(zo_file_fopen_write(path, 1, &f)); /* append keeps it */
    fputs("+more", f);
    assert_int_equal(fclose(f), 0);
    ZO_ASSERT_OK(zo_file_fopen_write(path, 0, &f)); /* truncate does not */
    fputs("new", f);
    assert_int_equal(fclose(f), 0);
    f = fopen(path, "r");
    assert_non_null(fgets(buf, sizeof buf, f));
    fclose(f);
    assert_string_equal(buf, "new");

    expect_error(zo_file_fopen_write(g_dir, 0, &f), ZO_ERR_INVALID_ARG, "is a directory");
    path_in_dir(fifo, sizeof fifo, "wfifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    expect_error(zo_file_fopen_write(fifo, 0, &f), ZO_ERR_INVALID_ARG,
                 "is a FIFO that nobody reads");
    int reader = open(fifo, O_RDONLY | O_NONBLOCK); /* with a reader it is a stream */
    assert_true(reader >= 0);
    ZO_ASSERT_OK(zo_file_fopen_write(fifo, 0, &f));
    fputs("piped", f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(read(reader, buf, sizeof buf), 5);
    close(reader);
    unlink(fifo);
    ZO_ASSERT_OK(zo_file_fopen_write("/dev/null", 0, &f)); /* devices that take writes */
    fclose(f);
}

static void test_check_dir(void **state)
{
    char path[300];
    ZO_ASSERT_OK(zo_file_check_dir(g_dir));
    path_in_dir(path, sizeof path, "plain");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    expect_error(zo_file_check_dir(path), ZO_ERR_INVALID_ARG,
                 "is a regular file: expected a directory");
    path_in_dir(path, sizeof path, "none");
    expect_error(zo_file_check_dir(path), ZO_ERR_NOT_FOUND, "does not exist: expected a directory");
}

static int setup(void **state)
{
    snprintf(g_dir, sizeof g_dir, "%s/zo-file-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_takes_regular_files_only),
        cmocka_unit_test(test_write_refuses_what_would_block),
        cmocka_unit_test(test_check_dir),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
