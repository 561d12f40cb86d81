/* A C filter built out of tree: keeps workers with no active requests. */
#include <switchyard/plugin.h>

static int32_t create(void *user_data, const switchyard_params *params, const switchyard_partition *partition,
                      void **out_instance, const switchyard_error *error) {
    (void)user_data; (void)partition;
    if (params->callback_key_count(params) != 0) {
        switchyard_error_printf(error, "oot.idle-only takes no parameters");
        return SWITCHYARD_STATUS_INVALID_PARAMETERS;
    }
    *out_instance = NULL;
    return SWITCHYARD_STATUS_OK;
}

static int32_t idle_only(void *instance, const switchyard_request *request, const switchyard_candidates *candidates,
                         uint8_t *keep, const switchyard_error *error) {
    (void)instance; (void)request; (void)error;
    for (size_t row = 0; row < candidates->count; row++) keep[row] = candidates->active_requests[row] == 0;
    return SWITCHYARD_STATUS_OK;
}

static int32_t register_types(const switchyard_registrar *registrar, const switchyard_error *error) {
    static const switchyard_component_def def = {
        sizeof(switchyard_component_def), SWITCHYARD_COMPONENT_FILTER, SWITCHYARD_INPUT_LOAD, 0, "oot.idle-only", NULL,
        create, NULL, idle_only, NULL, NULL,
    };
    return registrar->callback_register_component(registrar, &def, error);
}

SWITCHYARD_DECLARE_FILTER("oot.idle-only", SWITCHYARD_INPUT_LOAD)
SWITCHYARD_PLUGIN("oot-idle-only", "1.0.0", "out-of-tree test", register_types)
