/* The option table zo-train and zo-plan share (tools/common/zt_cli.h): each
 * tool offers a name once, its --help lists every option it offers within
 * the line width, a short alias gives its long option, and the value
 * parsers take exactly what the tools' help texts say. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "zt_cli.h"

static const zt_tool tools[] = {ZT_TOOL_TRAIN, ZT_TOOL_PLAN};
static const char *const progs[] = {"zo-train", "zo-plan"};

/* The tool's --help, in a malloc'd string. */
static char *usage_text(zt_tool tool)
{
    zt_cli c;
    char *text = NULL;
    size_t len = 0;
    zt_cli_init(&c, tool, progs[tool]);
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    zt_cli_usage(&c, f, "tiny, small");
    fclose(f);
    return text;
}

static void test_each_tool_offers_a_name_once(void **state)
{
    (void)state;
    int n;
    const zt_cli_opt *t = zt_cli_table(&n);
    assert_int_equal(n, ZT_N_OPTS);
    for (int i = 0; i < n; i++) {
        assert_int_equal(t[i].id, ZT_OPT_FIRST + i);
        assert_string_equal(zt_cli_name(t[i].id), t[i].name);
        for (int j = 0; j < i; j++)
            for (size_t k = 0; k < 2; k++) {
                zt_tool tool = tools[k];
                if (!t[i].use[tool].section || !t[j].use[tool].section)
                    continue;
                if (strcmp(t[i].name, t[j].name) == 0)
                    fail_msg("%s offers --%s twice", progs[tool], t[i].name);
                if (t[i].short_name && t[i].short_name == t[j].short_name)
                    fail_msg("%s offers -%c twice", progs[tool], t[i].short_name);
            }
    }
    assert_string_equal(zt_cli_name(ZT_OPT_END), "?");
}

/* Each offered option is in the help text (so its section has a title in the
 * tool's --help), as "--name" followed by its value, and a joined head ("")
 * is not the last of its section. */
static void test_help_lists_every_offered_option(void **state)
{
    (void)state;
    int n;
    const zt_cli_opt *t = zt_cli_table(&n);
    for (size_t k = 0; k < 2; k++) {
        zt_tool tool = tools[k];
        char *text = usage_text(tool);
        for (int i = 0; i < n; i++) {
            const zt_cli_use *u = &t[i].use[tool];
            if (!u->section)
                continue;
            char flag[64];
            snprintf(flag, sizeof flag, "--%s%s", t[i].name, u->value && u->help ? " " : "");
            if (!strstr(text, flag))
                fail_msg("%s --help does not mention %s", progs[tool], flag);
            if (u->value && u->help && !strstr(text + (strstr(text, flag) - text), u->value))
                fail_msg("%s --help does not give %s's value %s", progs[tool], flag, u->value);
            if (u->help && !u->help[0]) {
                int j = i + 1;
                while (j < n && t[j].use[tool].section != u->section)
                    j++;
                if (j == n)
                    fail_msg("%s: --%s joins a line that never comes", progs[tool], t[i].name);
            }
        }
        free(text);
    }
}

/* Lines within 90 columns; the text after a head starts at
 * column 25 or after three spaces, and "{presets}" is replaced. */
static void test_help_lines_fit_and_align(void **state)
{
    (void)state;
    for (size_t k = 0; k < 2; k++) {
        char *text = usage_text(tools[k]);
        assert_null(strstr(text, "{presets}"));
        assert_non_null(strstr(text, "tiny, small (default tiny)"));
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            if (strlen(line) > 90)
                fail_msg("%s --help: line over 90 columns: '%s'", progs[k], line);
            if (line[0] == ' ' && line[2] != '-' && strspn(line, " ") != 25)
                fail_msg("%s --help: continuation not at column 25: '%s'", progs[k], line);
        }
        free(text);
    }
}

/* Parses argv as tool does, the ids in order, -1 at the end. */
static void expect_ids(zt_tool tool, int argc, char **argv, const int *ids, const char *last_arg)
{
    zt_cli c;
    zt_cli_init(&c, tool, progs[tool]);
    optind = 0;
    for (int i = 0;; i++) {
        int opt = zt_cli_next(&c, argc, argv);
        assert_int_equal(opt, ids[i]);
        if (opt == -1)
            break;
        if (ids[i + 1] == -1 && last_arg)
            assert_string_equal(optarg, last_arg);
    }
}

static void test_short_alias_gives_its_long_option(void **state)
{
    (void)state;
    char *train[] = {"zo-train", "-v", "--json", "--steps", "3", NULL};
    const int train_ids[] = {ZT_OPT_VERBOSE, ZT_OPT_JSON, ZT_OPT_STEPS, -1};
    expect_ids(ZT_TOOL_TRAIN, 5, train, train_ids, "3");
    /* zo-plan offers neither -v nor --steps: both unknown to it */
    char *plan[] = {"zo-plan", "-v", "--steps", "3", "--world-size", "4", NULL};
    const int plan_ids[] = {'?', '?', ZT_OPT_WORLD_SIZE, -1};
    expect_ids(ZT_TOOL_PLAN, 6, plan, plan_ids, "4");
    char *missing[] = {"zo-plan", "--seq", NULL};
    const int missing_ids[] = {'?', -1};
    expect_ids(ZT_TOOL_PLAN, 2, missing, missing_ids, NULL);
}

static void test_value_parsers_take_what_the_help_says(void **state)
{
    (void)state;
    long v = 7;
    assert_int_equal(zt_cli_long("12", 1, 12, &v), 0);
    assert_int_equal(v, 12);
    const char *bad_longs[] = {"13", "0", "", "1x", "x", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad_longs / sizeof bad_longs[0]; i++) {
        assert_int_equal(zt_cli_long(bad_longs[i], 1, 12, &v), -1);
        assert_int_equal(v, 12);
    }
    double d = 0;
    assert_int_equal(zt_cli_double("2e-3", &d), 0);
    assert_true(d == 2e-3);
    assert_int_equal(zt_cli_double("inf", &d), -1);
    assert_int_equal(zt_cli_double("nan", &d), -1);
    assert_int_equal(zt_cli_double("1e999", &d), -1);
    assert_int_equal(zt_cli_double("", &d), -1);

    int on = -1;
    assert_int_equal(zt_cli_on_off("on", &on), 0);
    assert_int_equal(on, 1);
    assert_int_equal(zt_cli_on_off("off", &on), 0);
    assert_int_equal(on, 0);
    assert_int_equal(zt_cli_on_off("yes", &on), -1);

    zo_dtype t = ZO_DTYPE_I8;
    const char *names[] = {"bf16", "fp16", "fp32"};
    const zo_dtype types[] = {ZO_DTYPE_BF16, ZO_DTYPE_F16, ZO_DTYPE_F32};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(zt_cli_dtype(names[i], &t), 0);
        assert_int_equal(t, types[i]);
    }
    assert_int_equal(zt_cli_dtype("fp8", &t), -1);
    assert_int_equal(t, ZO_DTYPE_F32);

    /* The modes by the names JSON writes (zo_optim_mode_name), both ways. */
    for (int m = ZO_OPTIM_SYNC; m <= ZO_OPTIM_DPU; m++) {
        zo_optim_mode got = (zo_optim_mode)-1;
        assert_int_equal(zt_cli_optim_mode(zo_optim_mode_name((zo_optim_mode)m), &got), 0);
        assert_int_equal(got, m);
    }
    zo_optim_mode mode = ZO_OPTIM_DPU;
    assert_int_equal(zt_cli_optim_mode("auto", &mode), -1);
    assert_int_equal(zt_cli_optim_mode("Sync", &mode), -1);
    assert_int_equal(mode, ZO_OPTIM_DPU);

    assert_int_equal(zt_cli_choice("auto", zt_cli_devices), 0);
    assert_int_equal(zt_cli_choice("cuda", zt_cli_devices), 2);
    assert_int_equal(zt_cli_choice("gpu", zt_cli_devices), -1);
    const char *const choices[] = {"global", "rank", NULL};
    assert_int_equal(zt_cli_choice("rank", choices), 1);
    assert_int_equal(zt_cli_choice("ranks", choices), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_tool_offers_a_name_once),
        cmocka_unit_test(test_help_lists_every_offered_option),
        cmocka_unit_test(test_help_lines_fit_and_align),
        cmocka_unit_test(test_short_alias_gives_its_long_option),
        cmocka_unit_test(test_value_parsers_take_what_the_help_says),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
