/* libFuzzer target for the config parser. The input is a JSON document; when
 * it starts with '#', its first line (after the '#') is applied as a
 * command-line override "KEY=VALUE". Every config that resolves must
 * serialize, and its serialization must resolve to the same text: a mismatch
 * aborts, so the fuzzer reports it like a crash. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zo/config.h"
#include "zo/log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    zo_log_set_level(ZO_LOG_NONE); /* ignored-key warnings would flood the output */
    return 0;
}

static void check_round_trip(const zo_train_config *cfg)
{
    char *text = NULL, *again = NULL;
    if (zo_train_config_to_json(cfg, 0, &text) != ZO_OK)
        abort();
    zo_config_t c = NULL;
    zo_train_config back = ZO_TRAIN_CONFIG_INIT;
    if (zo_config_init(&c) != ZO_OK)
        abort();
    if (zo_config_load_string(c, text, "<round trip>") != ZO_OK)
        abort();
    if (zo_config_resolve(c, cfg->world_size, &back) != ZO_OK) {
        fprintf(stderr, "serialized config does not resolve: %s\n%s\n", zo_last_error(), text);
        abort();
    }
    if (zo_train_config_to_json(&back, 0, &again) != ZO_OK || strcmp(text, again) != 0) {
        fprintf(stderr, "round trip changed the config:\n%s\n%s\n", text, again ? again : "(null)");
        abort();
    }
    zo_config_free(c);
    free(text);
    free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *json = buf, *override = NULL;
    if (buf[0] == '#') {
        char *nl = strchr(buf, '\n');
        override = buf + 1;
        json = nl ? nl + 1 : buf + size;
        if (nl)
            *nl = '\0';
    }
    zo_config_t c = NULL;
    if (zo_config_init(&c) == ZO_OK) {
        zo_train_config cfg = ZO_TRAIN_CONFIG_INIT;
        int64_t world = 1 + (int64_t)(size % 4);
        zo_status st = zo_config_load_string(c, json, "<fuzz>");
        if (st == ZO_OK && override)
            st = zo_config_set_arg(c, override);
        if (st == ZO_OK)
            st = zo_config_resolve(c, world, &cfg);
        if (st == ZO_OK)
            check_round_trip(&cfg);
        zo_config_free(c);
    }
    free(buf);
    return 0;
}
