/*
 * Zone routing in C, with the two ABI 1.1 additions:
 *
 * - `c.label-equals`, a filter over worker labels (the LABELS input group): keeps the
 *   workers whose label `key` equals `value`, e.g. {key: zone, value: a}.
 * - `c.zone-least-busy`, a policy type composed with the router's built-in components
 *   through the builder's `callback_add_registered`: this plugin's label filter, then
 *   `builtin.active-requests` and `builtin.lowest-cost`, which it does not reimplement.
 *
 * Needs nothing but <switchyard/plugin.h> (ABI 1.1 or later).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <switchyard/plugin.h>

typedef struct {
    char key[64];
    char value[64];
} label_match;

/* Copies string parameter `name` into `out` (capacity `cap`): required, non-empty. */
static int32_t read_string(const switchyard_params *params, const char *name, char *out, size_t cap,
                           const switchyard_error *error) {
    switchyard_str value = {NULL, 0};
    switchyard_str key = {name, strlen(name)};
    int32_t status = params->callback_get_string(params, key, &value);
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

/* Refuses every key but the `n` in `allowed`. */
static int32_t only_keys(const switchyard_params *params, const char *const *allowed, size_t n,
                         const switchyard_error *error) {
    size_t count = params->callback_key_count(params);
    for (size_t i = 0; i < count; i++) {
        switchyard_str name = {NULL, 0};
        params->callback_key_at(params, i, &name);
        int known = 0;
        for (size_t a = 0; a < n; a++) {
            known |= name.len == strlen(allowed[a]) && memcmp(name.ptr, allowed[a], name.len) == 0;
        }
        if (!known) {
            switchyard_error_printf(error, "unknown parameter `%.*s`", (int)name.len, name.ptr);
            return SWITCHYARD_STATUS_INVALID_PARAMETERS;
        }
    }
    return SWITCHYARD_STATUS_OK;
}

static void free_instance(void *instance) { free(instance); }

/* ---- filter: label equals ----------------------------------------------------------- */

static int32_t label_filter(void *instance, const switchyard_request *request,
                            const switchyard_candidates *candidates, uint8_t *keep,
                            const switchyard_error *error) {
    (void)request;
    const label_match *self = instance;
    if (candidates->struct_size < offsetof(switchyard_candidates, callback_get_label) + sizeof(void *) ||
        candidates->callback_get_label == NULL) {
        switchyard_error_printf(error, "worker labels unavailable (declare SWITCHYARD_INPUT_LABELS; router ABI >= 1.1)");
        return SWITCHYARD_STATUS_ERROR;
    }
    for (size_t row = 0; row < candidates->count; row++) {
        keep[row] = (uint8_t)switchyard_candidate_label_is(candidates, row, self->key, self->value);
    }
    return SWITCHYARD_STATUS_OK;
}

static int32_t label_create(void *user_data, const switchyard_params *params,
                            const switchyard_partition *partition, void **out_instance,
                            const switchyard_error *error) {
    (void)user_data;
    (void)partition;
    static const char *const allowed[] = {"key", "value"};
    label_match match;
    int32_t status = only_keys(params, allowed, 2, error);
    if (status == SWITCHYARD_STATUS_OK) status = read_string(params, "key", match.key, sizeof match.key, error);
    if (status == SWITCHYARD_STATUS_OK) status = read_string(params, "value", match.value, sizeof match.value, error);
    if (status != SWITCHYARD_STATUS_OK) return status;
    label_match *self = malloc(sizeof *self);
    if (self == NULL) {
        switchyard_error_printf(error, "out of memory");
        return SWITCHYARD_STATUS_ERROR;
    }
    *self = match;
    *out_instance = self;
    return SWITCHYARD_STATUS_OK;
}

static const switchyard_component_def label_filter_def = {
    .struct_size = sizeof(switchyard_component_def),
    .kind = SWITCHYARD_COMPONENT_FILTER,
    .inputs = SWITCHYARD_INPUT_LABELS,
    .type_name = "c.label-equals",
    .on_create = label_create,
    .on_destroy = free_instance,
    .on_filter = label_filter,
};

/* ---- policy: zone-least-busy, composed with built-ins -------------------------------- */

static int32_t zone_validate(void *user_data, const switchyard_params *params, void **out_factory,
                             const switchyard_error *error) {
    (void)user_data;
    static const char *const allowed[] = {"zone"};
    label_match match;
    strcpy(match.key, "zone");
    int32_t status = only_keys(params, allowed, 1, error);
    if (status == SWITCHYARD_STATUS_OK) status = read_string(params, "zone", match.value, sizeof match.value, error);
    if (status != SWITCHYARD_STATUS_OK) return status;
    label_match *factory = malloc(sizeof *factory);
    if (factory == NULL) {
        switchyard_error_printf(error, "out of memory");
        return SWITCHYARD_STATUS_ERROR;
    }
    *factory = match;
    *out_factory = factory;
    return SWITCHYARD_STATUS_OK;
}

static int32_t zone_build(void *factory, const switchyard_partition *partition,
                          const switchyard_policy_builder *builder, const switchyard_error *error) {
    (void)partition;
    label_match *filter = malloc(sizeof *filter);
    if (filter == NULL) {
        switchyard_error_printf(error, "out of memory");
        return SWITCHYARD_STATUS_ERROR;
    }
    *filter = *(const label_match *)factory;
    /* The host owns the instance from this call on, whatever the status. */
    int32_t status = builder->callback_add_component(builder, &label_filter_def, filter, 1.0, error);
    if (status == SWITCHYARD_STATUS_OK) {
        status = switchyard_builder_add_registered(builder, "builtin.active-requests", "", 1.0, error);
    }
    if (status == SWITCHYARD_STATUS_OK) {
        status = switchyard_builder_add_registered(builder, "builtin.lowest-cost", "{\"tie_break\": \"worker-id\"}", 1.0,
                                                   error);
    }
    return status;
}

static const switchyard_policy_def zone_policy_def = {
    .struct_size = sizeof(switchyard_policy_def),
    .type_name = "c.zone-least-busy",
    .on_validate = zone_validate,
    .on_destroy_factory = free_instance,
    .on_build = zone_build,
};

static int32_t register_types(const switchyard_registrar *registrar, const switchyard_error *error) {
    int32_t status = registrar->callback_register_component(registrar, &label_filter_def, error);
    if (status == SWITCHYARD_STATUS_OK) {
        status = registrar->callback_register_policy(registrar, &zone_policy_def, error);
    }
    return status;
}

SWITCHYARD_DECLARE_FILTER("c.label-equals", SWITCHYARD_INPUT_LABELS)
SWITCHYARD_DECLARE_POLICY("c.zone-least-busy")

SWITCHYARD_PLUGIN("acme-zone-c", "0.1.0", "Acme Corp (switchyard example)", register_types)
