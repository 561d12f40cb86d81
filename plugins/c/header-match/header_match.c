/*
 * A vendor filter in C with ABI 1.2's request attributes: `c.label-matches-header`
 * keeps the workers whose label `label` equals the request's header `header`, e.g.
 * {label: zone, header: x-zone} sends a caller's request to its own zone, and
 * {label: tenant, header: x-tenant} keeps a tenant on its workers. The router hands a
 * plugin only the headers the operator lists in `request_attributes.headers`.
 *
 * A request without the header keeps every worker (`when_absent: keep`, the default) or
 * none (`when_absent: reject`: selection fails, naming this filter).
 *
 * Needs nothing but <switchyard/plugin.h> (ABI 1.2 or later).
 */
#include <stdlib.h>
#include <string.h>

#include <switchyard/plugin.h>

typedef struct {
    char label[64];
    char header[64];
    int reject_when_absent;
} header_match;

/* Copies string parameter `name` into `out` (capacity `cap`); `required` or it keeps
 * `out` as it is when absent. */
static int32_t read_string(const switchyard_params *params, const char *name, char *out, size_t cap,
                           int required, const switchyard_error *error) {
    switchyard_str value = {NULL, 0};
    switchyard_str key = {name, strlen(name)};
    int32_t status = params->callback_get_string(params, key, &value);
    if (status == SWITCHYARD_STATUS_NOT_FOUND && !required) {
        return SWITCHYARD_STATUS_OK;
    }
    if (status == SWITCHYARD_STATUS_NOT_FOUND) {
        switchyard_error_printf(error, "missing parameter `%s` (a string)", name);
        return SWITCHYARD_STATUS_INVALID_PARAMETERS;
    }
    if (status != SWITCHYARD_STATUS_OK || value.len == 0 || value.len >= cap) {
        switchyard_error_printf(error, "`%s` must be a non-empty string of at most %zu bytes", name, cap - 1);
        return SWITCHYARD_STATUS_INVALID_PARAMETERS;
    }
    memcpy(out, value.ptr, value.len);
    out[value.len] = '\0';
    return SWITCHYARD_STATUS_OK;
}

static int32_t match_filter(void *instance, const switchyard_request *request,
                            const switchyard_candidates *candidates, uint8_t *keep,
                            const switchyard_error *error) {
    const header_match *self = instance;
    if (switchyard_request_attrs(request) == NULL) {
        switchyard_error_printf(error, "request attributes unavailable (declare SWITCHYARD_INPUT_ATTRIBUTES; router ABI >= 1.2)");
        return SWITCHYARD_STATUS_ERROR;
    }
    size_t wanted_len = 0;
    const char *wanted = switchyard_request_header(request, self->header, &wanted_len);
    for (size_t row = 0; row < candidates->count; row++) {
        if (wanted == NULL) {
            keep[row] = (uint8_t)!self->reject_when_absent;
            continue;
        }
        size_t len = 0;
        const char *found = switchyard_candidate_label(candidates, row, self->label, &len);
        keep[row] = (uint8_t)(found != NULL && len == wanted_len && memcmp(found, wanted, len) == 0);
    }
    return SWITCHYARD_STATUS_OK;
}

static int32_t match_create(void *user_data, const switchyard_params *params,
                            const switchyard_partition *partition, void **out_instance,
                            const switchyard_error *error) {
    (void)user_data;
    (void)partition;
    size_t count = params->callback_key_count(params);
    for (size_t i = 0; i < count; i++) {
        switchyard_str name = {NULL, 0};
        params->callback_key_at(params, i, &name);
        static const char *const allowed[] = {"label", "header", "when_absent"};
        int known = 0;
        for (size_t a = 0; a < 3; a++) {
            known |= name.len == strlen(allowed[a]) && memcmp(name.ptr, allowed[a], name.len) == 0;
        }
        if (!known) {
            switchyard_error_printf(error, "unknown parameter `%.*s` (expected label, header, when_absent)",
                                    (int)name.len, name.ptr);
            return SWITCHYARD_STATUS_INVALID_PARAMETERS;
        }
    }
    header_match match = {"", "", 0};
    char when_absent[16] = "keep";
    int32_t status = read_string(params, "label", match.label, sizeof match.label, 1, error);
    if (status == SWITCHYARD_STATUS_OK) status = read_string(params, "header", match.header, sizeof match.header, 1, error);
    if (status == SWITCHYARD_STATUS_OK) status = read_string(params, "when_absent", when_absent, sizeof when_absent, 0, error);
    if (status != SWITCHYARD_STATUS_OK) return status;
    if (strcmp(when_absent, "keep") != 0 && strcmp(when_absent, "reject") != 0) {
        switchyard_error_printf(error, "`when_absent` is `keep` or `reject`, got `%s`", when_absent);
        return SWITCHYARD_STATUS_INVALID_PARAMETERS;
    }
    match.reject_when_absent = strcmp(when_absent, "reject") == 0;
    header_match *self = malloc(sizeof *self);
    if (self == NULL) {
        switchyard_error_printf(error, "out of memory");
        return SWITCHYARD_STATUS_ERROR;
    }
    *self = match;
    *out_instance = self;
    return SWITCHYARD_STATUS_OK;
}

static void match_destroy(void *instance) { free(instance); }

static const switchyard_component_def match_def = {
    .struct_size = sizeof(switchyard_component_def),
    .kind = SWITCHYARD_COMPONENT_FILTER,
    .inputs = SWITCHYARD_INPUT_LABELS | SWITCHYARD_INPUT_ATTRIBUTES,
    .type_name = "c.label-matches-header",
    .on_create = match_create,
    .on_destroy = match_destroy,
    .on_filter = match_filter,
};

static int32_t register_types(const switchyard_registrar *registrar, const switchyard_error *error) {
    return registrar->callback_register_component(registrar, &match_def, error);
}

SWITCHYARD_DECLARE_FILTER("c.label-matches-header", SWITCHYARD_INPUT_LABELS | SWITCHYARD_INPUT_ATTRIBUTES)

SWITCHYARD_PLUGIN("acme-header-match-c", "0.1.0", "Acme Corp (switchyard example)", register_types)
