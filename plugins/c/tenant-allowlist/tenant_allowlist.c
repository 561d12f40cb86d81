/*
 * A vendor admitter in C (ABI 1.3): `c.tenant-allowlist` serves only the tenants it
 * lists, each at its own priority, and keeps any one tenant from filling the queue.
 *
 *   admission:
 *     admitters:
 *       - type: c.tenant-allowlist
 *         parameters:
 *           tenants: [{name: interactive, priority: 10}, {name: batch, priority: 0}]
 *           max_queued_per_tenant: 32     # optional: past it, 429 with Retry-After: 1
 *           status: 403                   # optional: the answer for a tenant not listed
 *
 * The tenant is the request's (`request_attributes.tenant`: the API key's grant, a
 * header, or the OpenAI `user` field). A request without one, or of a tenant not listed,
 * is refused with `status` (403 by default), naming the tenant.
 *
 * Needs nothing but <switchyard/plugin.h> (ABI 1.3 or later).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <switchyard/plugin.h>

#define MAX_TENANTS 256
#define MAX_NAME 128

typedef struct {
    char name[MAX_NAME];
    size_t len;
    int32_t priority;
} tenant;

typedef struct {
    tenant tenants[MAX_TENANTS];
    size_t count;
    uint64_t max_queued_per_tenant; /* 0: no limit */
    uint32_t status;
} allowlist;

static int32_t allowlist_admit(void *instance, const switchyard_request *request,
                               const switchyard_saturation *saturation,
                               switchyard_admission *decision, const switchyard_error *error) {
    (void)error;
    const allowlist *self = instance;
    const switchyard_request_attributes *attributes = switchyard_request_attrs(request);
    if (attributes == NULL || attributes->tenant.ptr == NULL) {
        switchyard_admission_reject(decision, self->status, 0,
                                    "this router serves only listed tenants, and the request names none");
        return SWITCHYARD_STATUS_OK;
    }
    const switchyard_str name = attributes->tenant;
    for (size_t i = 0; i < self->count; i++) {
        const tenant *t = &self->tenants[i];
        if (t->len != name.len || memcmp(t->name, name.ptr, name.len) != 0) {
            continue;
        }
        if (self->max_queued_per_tenant > 0 && saturation->queued_tenant >= self->max_queued_per_tenant) {
            switchyard_admission_reject(decision, 429, 1,
                                        "tenant `%s` already has %llu requests waiting (c.tenant-allowlist max_queued_per_tenant)",
                                        t->name, (unsigned long long)saturation->queued_tenant);
            return SWITCHYARD_STATUS_OK;
        }
        switchyard_admission_set_priority(decision, t->priority);
        return SWITCHYARD_STATUS_OK;
    }
    switchyard_admission_reject(decision, self->status, 0, "tenant `%.*s` is not served by this router",
                                (int)(name.len > MAX_NAME ? MAX_NAME : name.len), name.ptr);
    return SWITCHYARD_STATUS_OK;
}

static int key_is(switchyard_str key, const char *name) {
    return key.len == strlen(name) && memcmp(key.ptr, name, key.len) == 0;
}

static int32_t allowlist_create(void *user_data, const switchyard_params *params,
                                const switchyard_partition *partition, void **out_instance,
                                const switchyard_error *error) {
    (void)user_data;
    (void)partition;
    size_t keys = params->callback_key_count(params);
    for (size_t i = 0; i < keys; i++) {
        switchyard_str key = {NULL, 0};
        params->callback_key_at(params, i, &key);
        if (!key_is(key, "tenants") && !key_is(key, "max_queued_per_tenant") && !key_is(key, "status")) {
            switchyard_error_printf(error, "unknown parameter `%.*s` (expected tenants, max_queued_per_tenant, status)",
                                    (int)key.len, key.ptr);
            return SWITCHYARD_STATUS_INVALID_PARAMETERS;
        }
    }
    allowlist *self = calloc(1, sizeof *self);
    if (self == NULL) {
        switchyard_error_printf(error, "out of memory");
        return SWITCHYARD_STATUS_ERROR;
    }
    self->status = 403;
    double number = 0;
    if (params->callback_get_number(params, SWITCHYARD_STR("status"), &number) == SWITCHYARD_STATUS_OK) {
        if (!(number >= 400 && number <= 599) || number != (double)(uint32_t)number) {
            switchyard_error_printf(error, "`status` is an HTTP status from 400 to 599, got %g", number);
            free(self);
            return SWITCHYARD_STATUS_INVALID_PARAMETERS;
        }
        self->status = (uint32_t)number;
    }
    if (params->callback_get_number(params, SWITCHYARD_STR("max_queued_per_tenant"), &number) == SWITCHYARD_STATUS_OK) {
        if (!(number >= 1 && number <= 1e9) || number != (double)(uint64_t)number) {
            switchyard_error_printf(error, "`max_queued_per_tenant` is a whole number of at least 1, got %g", number);
            free(self);
            return SWITCHYARD_STATUS_INVALID_PARAMETERS;
        }
        self->max_queued_per_tenant = (uint64_t)number;
    }
    for (;;) {
        char pointer[64];
        switchyard_str value = {NULL, 0};
        snprintf(pointer, sizeof pointer, "/tenants/%zu/name", self->count);
        switchyard_str key = {pointer, strlen(pointer)};
        int32_t status = params->callback_get_string(params, key, &value);
        if (status == SWITCHYARD_STATUS_NOT_FOUND) {
            break;
        }
        if (status != SWITCHYARD_STATUS_OK || value.len == 0 || value.len >= MAX_NAME) {
            switchyard_error_printf(error, "`tenants[%zu].name` must be a non-empty string of at most %d bytes",
                                    self->count, MAX_NAME - 1);
            free(self);
            return SWITCHYARD_STATUS_INVALID_PARAMETERS;
        }
        if (self->count == MAX_TENANTS) {
            switchyard_error_printf(error, "at most %d tenants", MAX_TENANTS);
            free(self);
            return SWITCHYARD_STATUS_INVALID_PARAMETERS;
        }
        tenant *t = &self->tenants[self->count];
        memcpy(t->name, value.ptr, value.len);
        t->name[value.len] = '\0';
        t->len = value.len;
        snprintf(pointer, sizeof pointer, "/tenants/%zu/priority", self->count);
        key.len = strlen(pointer);
        double priority = 0;
        status = params->callback_get_number(params, key, &priority);
        if (status == SWITCHYARD_STATUS_NOT_FOUND) {
            priority = 0;
        } else if (status != SWITCHYARD_STATUS_OK || priority != (double)(int32_t)priority) {
            switchyard_error_printf(error, "`tenants[%zu].priority` must be a whole number", self->count);
            free(self);
            return SWITCHYARD_STATUS_INVALID_PARAMETERS;
        }
        t->priority = (int32_t)priority;
        self->count++;
    }
    if (self->count == 0) {
        switchyard_error_printf(error, "missing `tenants`: a list of {name, priority}; an empty allow-list refuses everyone");
        free(self);
        return SWITCHYARD_STATUS_INVALID_PARAMETERS;
    }
    *out_instance = self;
    return SWITCHYARD_STATUS_OK;
}

static void allowlist_destroy(void *instance) { free(instance); }

static const switchyard_component_def allowlist_def = {
    .struct_size = sizeof(switchyard_component_def),
    .kind = SWITCHYARD_COMPONENT_ADMITTER,
    .inputs = SWITCHYARD_INPUT_ATTRIBUTES,
    .type_name = "c.tenant-allowlist",
    .on_create = allowlist_create,
    .on_destroy = allowlist_destroy,
    .on_admit = allowlist_admit,
};

static int32_t register_types(const switchyard_registrar *registrar, const switchyard_error *error) {
    return registrar->callback_register_component(registrar, &allowlist_def, error);
}

SWITCHYARD_DECLARE_ADMITTER("c.tenant-allowlist", SWITCHYARD_INPUT_ATTRIBUTES)

SWITCHYARD_PLUGIN("acme-tenant-allowlist-c", "0.1.0", "Acme Corp (switchyard example)", register_types)
