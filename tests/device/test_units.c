/* The shared units (zo/units.h) against expected values: every spelling the
 * tools' size flags accept, what they refuse, and the two byte formats. */
#include <stdint.h>

#include "zo/units.h"
#include "zo_test.h"

static uint64_t parsed(const char *text)
{
    uint64_t v = 12345;
    assert_int_equal(zo_parse_bytes(text, &v), ZO_OK);
    return v;
}

static void refused(const char *text)
{
    uint64_t v = 12345;
    assert_int_equal(zo_parse_bytes(text, &v), ZO_ERR_INVALID_ARG);
    assert_int_equal(v, 12345); /* untouched */
}

static void test_parse_plain_and_binary(void **state)
{
    (void)state;
    assert_int_equal(parsed("0"), 0);
    assert_int_equal(parsed("4096"), 4096);
    assert_int_equal(parsed("4096B"), 4096);
    assert_int_equal(parsed("64K"), 64ull << 10);
    assert_int_equal(parsed("64k"), 64ull << 10);
    assert_int_equal(parsed("1KiB"), 1024);
    assert_int_equal(parsed("512M"), 512ull << 20);
    assert_int_equal(parsed("512MiB"), 512ull << 20);
    assert_int_equal(parsed("24GiB"), 24ull << 30);
    assert_int_equal(parsed("24gib"), 24ull << 30);
    assert_int_equal(parsed("2G"), 2ull << 30);
    assert_int_equal(parsed("3T"), 3ull << 40);
    assert_int_equal(parsed("3TiB"), 3ull << 40);
    assert_int_equal(parsed("+8"), 8);
    assert_int_equal(parsed(" 8"), 8);
    assert_int_equal(parsed("12b"), 12);
    assert_int_equal(parsed("512 MiB"), 512ull << 20); /* DeepSpeed configs write it so */
    assert_int_equal(parsed("8 "), 8);
}

static void test_parse_decimal_and_fractions(void **state)
{
    (void)state;
    assert_int_equal(parsed("12kb"), 12000);
    assert_int_equal(parsed("12KB"), 12000);
    assert_int_equal(parsed("5MB"), 5000000);
    assert_int_equal(parsed("1.5GB"), 1500000000ull);
    assert_int_equal(parsed("2TB"), 2000000000000ull);
    assert_int_equal(parsed("1.5GiB"), 3ull << 29);
    assert_int_equal(parsed(".5K"), 512);
    assert_int_equal(parsed("1e3"), 1000);
    assert_int_equal(parsed("1.7"), 1); /* whole bytes, rounded down */
    assert_int_equal(parsed("0x10"), 16);
}

static void test_parse_limits(void **state)
{
    (void)state;
    assert_true(parsed("18446744073709551615") == UINT64_MAX); /* exact, not through a double */
    assert_true(parsed("9007199254740993") == 9007199254740993ull);
    assert_true(parsed("16777215T") == 16777215ull << 40);
    refused("18446744073709551616");
    refused("16777216T");
    refused("16777216TiB");
    refused("1e20");
    refused("20000000TB");
}

static void test_parse_refuses(void **state)
{
    (void)state;
    const char *bad[] = {"",  " ",   "-1", "-0",  "-1K", "abc",   "12x",    "12\tGiB", "1KBB",
                         "K", "GiB", ".",  "inf", "nan", "1.5.5", "12KiBs", "1e",      "--5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refused(bad[i]);
    uint64_t v;
    assert_int_equal(zo_parse_bytes(NULL, &v), ZO_ERR_INVALID_ARG);
    assert_int_equal(zo_parse_bytes("1", NULL), ZO_ERR_INVALID_ARG);
}

static void test_fmt_bytes(void **state)
{
    (void)state;
    char b[32];
    assert_string_equal(zo_fmt_bytes(b, sizeof b, 0), "0 B");
    assert_string_equal(zo_fmt_bytes(b, sizeof b, 1023), "1023 B");
    assert_string_equal(zo_fmt_bytes(b, sizeof b, 1024), "1.00 KiB");
    assert_string_equal(zo_fmt_bytes(b, sizeof b, 3ull << 29), "1.50 GiB");
    assert_string_equal(zo_fmt_bytes(b, sizeof b, 5ull << 50), "5.00 PiB");
    assert_string_equal(zo_fmt_bytes(b, sizeof b, UINT64_MAX), "16384.00 PiB");
    assert_string_equal(zo_fmt_bytes_prec(b, sizeof b, 512, 1), "512 B");
    assert_string_equal(zo_fmt_bytes_prec(b, sizeof b, 3ull << 29, 1), "1.5 GiB");
    assert_string_equal(zo_fmt_bytes_prec(b, sizeof b, 100000, 1), "97.7 KiB");
    assert_string_equal(zo_fmt_bytes_prec(b, sizeof b, 2ull << 40, 0), "2 TiB");
    char small[5];
    assert_string_equal(zo_fmt_bytes(small, sizeof small, 3ull << 29),
                        "1.50"); /* cut, terminated */
}

static void test_clock_is_monotonic(void **state)
{
    (void)state;
    uint64_t a = zo_now_ns(), b = zo_now_ns();
    assert_true(a > 0 && b >= a);
    double s = zo_now_s();
    assert_true(s >= (double)a * 1e-9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_plain_and_binary),
        cmocka_unit_test(test_parse_decimal_and_fractions),
        cmocka_unit_test(test_parse_limits),
        cmocka_unit_test(test_parse_refuses),
        cmocka_unit_test(test_fmt_bytes),
        cmocka_unit_test(test_clock_is_monotonic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
