/*
 * The reference's `least-busy` policy as a C plugin: keep workers with at least N
 * device-resident overlap blocks, cost = active requests, pick the lowest cost (ties to
 * the lowest worker id, so the choice does not depend on candidate order).
 *
 * Registers the policy type `c.least-busy` and its components standalone as
 * `c.min-device-overlap`, `c.active-requests` and `c.lowest-cost`.
 * Needs nothing but <switchyard/plugin.h>.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <switchyard/plugin.h>

/* Reads an optional finite, non-negative number `key` (default 0) and rejects every
 * other key. Returns a status; writes *out only on success. `inline`, so that a copy of
 * this file that stops calling it still builds under -Werror=unused-function. */
static inline int32_t read_min_blocks(const switchyard_params *params, const char *key, double *out,
                                      const switchyard_error *error) {
    size_t count = params->callback_key_count(params);
    for (size_t i = 0; i < count; i++) {
        switchyard_str name;
        if (params->callback_key_at(params, i, &name) != SWITCHYARD_STATUS_OK) {
            continue;
        }
        if (name.len != strlen(key) || memcmp(name.ptr, key, name.len) != 0) {
            switchyard_error_printf(error, "unknown parameter `%.*s`; expected: %s", (int)name.len,
                                    name.ptr, key);
            return SWITCHYARD_STATUS_INVALID_PARAMETERS;
        }
    }
    double value = 0.0;
    switchyard_str name = {key, strlen(key)};
    int32_t status = params->callback_get_number(params, name, &value);
    if (status == SWITCHYARD_STATUS_WRONG_TYPE) {
        switchyard_error_printf(error, "%s must be a number", key);
        return SWITCHYARD_STATUS_INVALID_PARAMETERS;
    }
    if (!isfinite(value) || value < 0.0) {
        switchyard_error_printf(error, "%s must be a finite non-negative number, got %g", key, value);
        return SWITCHYARD_STATUS_INVALID_PARAMETERS;
    }
    *out = value;
    return SWITCHYARD_STATUS_OK;
}

static int32_t no_parameters(const switchyard_params *params, const switchyard_error *error) {
    if (params->callback_key_count(params) != 0) {
        switchyard_str name = {"?", 1};
        params->callback_key_at(params, 0, &name);
        switchyard_error_printf(error, "unknown parameter `%.*s`; this component takes none",
                                (int)name.len, name.ptr);
        return SWITCHYARD_STATUS_INVALID_PARAMETERS;
    }
    return SWITCHYARD_STATUS_OK;
}

/* ---- filter: min device overlap ---------------------------------------------------- */

typedef struct {
    double min_blocks;
} min_overlap;

static int32_t min_overlap_filter(void *instance, const switchyard_request *request,
                                  const switchyard_candidates *candidates, uint8_t *keep,
                                  const switchyard_error *error) {
    (void)request;
    const min_overlap *self = instance;
    if (candidates->device_overlap_blocks == NULL) {
        switchyard_error_printf(error, "cache input unavailable");
        return SWITCHYARD_STATUS_ERROR;
    }
    /* Read into locals first: `keep` is a byte array, which may alias anything, so reads
     * through `candidates` or `self` would be repeated per row. And compare in the
     * column's own type: for a whole number of blocks d and a threshold m >= 0, d >= m
     * exactly when d >= ceil(m), and a 32-bit integer comparison vectorizes where a
     * conversion to double (or a 64-bit comparison) does not. */
    const uint32_t *device = candidates->device_overlap_blocks;
    const size_t count = candidates->count;
    if (self->min_blocks > 4294967295.0) {
        memset(keep, 0, count); /* more blocks than any worker can hold */
        return SWITCHYARD_STATUS_OK;
    }
    const uint32_t threshold = (uint32_t)ceil(self->min_blocks);
    for (size_t row = 0; row < count; row++) {
        keep[row] = device[row] >= threshold;
    }
    return SWITCHYARD_STATUS_OK;
}

static int32_t min_overlap_create(void *user_data, const switchyard_params *params,
                                  const switchyard_partition *partition, void **out_instance,
                                  const switchyard_error *error) {
    (void)user_data;
    (void)partition;
    double min_blocks;
    int32_t status = read_min_blocks(params, "min_blocks", &min_blocks, error);
    if (status != SWITCHYARD_STATUS_OK) {
        return status;
    }
    min_overlap *self = malloc(sizeof *self);
    if (self == NULL) {
        switchyard_error_printf(error, "out of memory");
        return SWITCHYARD_STATUS_ERROR;
    }
    self->min_blocks = min_blocks;
    *out_instance = self;
    return SWITCHYARD_STATUS_OK;
}

static void free_instance(void *instance) { free(instance); }

static const switchyard_component_def min_overlap_def = {
    .struct_size = sizeof(switchyard_component_def),
    .kind = SWITCHYARD_COMPONENT_FILTER,
    .inputs = SWITCHYARD_INPUT_CACHE,
    .type_name = "c.min-device-overlap",
    .on_create = min_overlap_create,
    .on_destroy = free_instance,
    .on_filter = min_overlap_filter,
};

/* ---- scorer: active requests ------------------------------------------------------- */

static int32_t active_requests_score(void *instance, const switchyard_request *request,
                                     const switchyard_candidates *candidates, double *costs,
                                     const switchyard_error *error) {
    (void)instance;
    (void)request;
    if (candidates->active_requests == NULL) {
        switchyard_error_printf(error, "load input unavailable");
        return SWITCHYARD_STATUS_ERROR;
    }
    const uint32_t *active = candidates->active_requests;
    const size_t count = candidates->count;
    for (size_t row = 0; row < count; row++) {
        costs[row] = (double)active[row];
    }
    return SWITCHYARD_STATUS_OK;
}

static int32_t stateless_create(void *user_data, const switchyard_params *params,
                                const switchyard_partition *partition, void **out_instance,
                                const switchyard_error *error) {
    (void)user_data;
    (void)partition;
    int32_t status = no_parameters(params, error);
    if (status == SWITCHYARD_STATUS_OK) {
        *out_instance = NULL;
    }
    return status;
}

static const switchyard_component_def active_requests_def = {
    .struct_size = sizeof(switchyard_component_def),
    .kind = SWITCHYARD_COMPONENT_SCORER,
    .inputs = SWITCHYARD_INPUT_LOAD,
    .type_name = "c.active-requests",
    .on_create = stateless_create,
    .on_score = active_requests_score,
};

/* ---- picker: lowest cost, ties to the lowest (worker_id, dp_rank) ------------------ */

static int32_t lowest_cost_pick(void *instance, const switchyard_request *request,
                                const switchyard_candidates *candidates, size_t *out_row,
                                const switchyard_error *error) {
    (void)instance;
    (void)request;
    if (candidates->count == 0) {
        switchyard_error_printf(error, "no eligible worker");
        return SWITCHYARD_STATUS_ERROR;
    }
    const double *costs = candidates->costs;
    const uint64_t *ids = candidates->worker_id;
    const uint32_t *ranks = candidates->dp_rank;
    size_t count = candidates->count;
    /* Two passes. First the lowest cost alone, in eight independent lanes: no branch, no
     * id read, and no lane waits on another. The host hands pickers finite costs. */
    double lanes[8];
    for (size_t lane = 0; lane < 8; lane++) {
        lanes[lane] = costs[0];
    }
    size_t row = 0;
    for (; row + 8 <= count; row += 8) {
        for (size_t lane = 0; lane < 8; lane++) {
            double cost = costs[row + lane];
            lanes[lane] = cost < lanes[lane] ? cost : lanes[lane];
        }
    }
    for (; row < count; row++) {
        lanes[0] = costs[row] < lanes[0] ? costs[row] : lanes[0];
    }
    double lowest = lanes[0];
    for (size_t lane = 1; lane < 8; lane++) {
        lowest = lanes[lane] < lowest ? lanes[lane] : lowest;
    }
    /* Then the lowest (worker_id, dp_rank) among the rows at that cost, four rows at a
     * time: most quads hold none, which their own minimum (above `lowest`) tells in one
     * comparison. */
    size_t best = SIZE_MAX;
    for (size_t start = 0; start < count; start += 4) {
        size_t end = start + 4 < count ? start + 4 : count;
        if (end - start == 4) {
            const double *quad = costs + start;
            double low = quad[0] < quad[1] ? quad[0] : quad[1];
            low = quad[2] < low ? quad[2] : low;
            low = quad[3] < low ? quad[3] : low;
            if (low > lowest) {
                continue;
            }
        }
        for (size_t row = start; row < end; row++) {
            if (costs[row] == lowest &&
                (best == SIZE_MAX || ids[row] < ids[best] ||
                 (ids[row] == ids[best] && ranks[row] < ranks[best]))) {
                best = row;
            }
        }
    }
    if (best == SIZE_MAX) {
        switchyard_error_printf(error, "no finite lowest cost");
        return SWITCHYARD_STATUS_ERROR;
    }
    *out_row = best;
    return SWITCHYARD_STATUS_OK;
}

static const switchyard_component_def lowest_cost_def = {
    .struct_size = sizeof(switchyard_component_def),
    .kind = SWITCHYARD_COMPONENT_PICKER,
    .inputs = 0,
    .type_name = "c.lowest-cost",
    .on_create = stateless_create,
    .on_pick = lowest_cost_pick,
};

/* ---- policy: least-busy ------------------------------------------------------------ */

static int32_t least_busy_validate(void *user_data, const switchyard_params *params,
                                   void **out_factory, const switchyard_error *error) {
    (void)user_data;
    double min_blocks;
    int32_t status = read_min_blocks(params, "min_device_overlap_blocks", &min_blocks, error);
    if (status != SWITCHYARD_STATUS_OK) {
        return status;
    }
    min_overlap *factory = malloc(sizeof *factory);
    if (factory == NULL) {
        switchyard_error_printf(error, "out of memory");
        return SWITCHYARD_STATUS_ERROR;
    }
    factory->min_blocks = min_blocks;
    *out_factory = factory;
    return SWITCHYARD_STATUS_OK;
}

static int32_t least_busy_build(void *factory, const switchyard_partition *partition,
                                const switchyard_policy_builder *builder,
                                const switchyard_error *error) {
    (void)partition;
    min_overlap *filter = malloc(sizeof *filter);
    if (filter == NULL) {
        switchyard_error_printf(error, "out of memory");
        return SWITCHYARD_STATUS_ERROR;
    }
    filter->min_blocks = ((const min_overlap *)factory)->min_blocks;
    /* The host owns each instance from the call on, whatever the status. */
    int32_t status = builder->callback_add_component(builder, &min_overlap_def, filter, 1.0, error);
    if (status == SWITCHYARD_STATUS_OK) {
        status = builder->callback_add_component(builder, &active_requests_def, NULL, 1.0, error);
    }
    if (status == SWITCHYARD_STATUS_OK) {
        status = builder->callback_add_component(builder, &lowest_cost_def, NULL, 1.0, error);
    }
    return status;
}

static const switchyard_policy_def least_busy_def = {
    .struct_size = sizeof(switchyard_policy_def),
    .type_name = "c.least-busy",
    .on_validate = least_busy_validate,
    .on_destroy_factory = free_instance,
    .on_build = least_busy_build,
};

static int32_t register_types(const switchyard_registrar *registrar, const switchyard_error *error) {
    int32_t status = registrar->callback_register_policy(registrar, &least_busy_def, error);
    if (status == SWITCHYARD_STATUS_OK) {
        status = registrar->callback_register_component(registrar, &min_overlap_def, error);
    }
    if (status == SWITCHYARD_STATUS_OK) {
        status = registrar->callback_register_component(registrar, &active_requests_def, error);
    }
    if (status == SWITCHYARD_STATUS_OK) {
        status = registrar->callback_register_component(registrar, &lowest_cost_def, error);
    }
    return status;
}

/* What register_types registers, for `switchyard plugin inspect` without loading. */
SWITCHYARD_DECLARE_POLICY("c.least-busy")
SWITCHYARD_DECLARE_FILTER("c.min-device-overlap", SWITCHYARD_INPUT_CACHE)
SWITCHYARD_DECLARE_SCORER("c.active-requests", SWITCHYARD_INPUT_LOAD)
SWITCHYARD_DECLARE_PICKER("c.lowest-cost", 0)

SWITCHYARD_PLUGIN("acme-least-busy-c", "0.1.0", "Acme Corp (switchyard example)", register_types)
