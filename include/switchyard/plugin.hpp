// switchyard plugin API for C++17: a header-only layer on top of plugin.h.
//
// It adds types and adaptation only: base classes for filters, scorers, pickers and
// policy factories; read-only views of the request, session and candidates; typed
// parameter access; and noexcept trampolines that turn exceptions into status codes.
//
// Errors: throw switchyard::Error (or InvalidParameters) to fail one call with
// SWITCHYARD_STATUS_ERROR (INVALID_PARAMETERS); the instance stays usable. Any other
// exception escaping a component returns SWITCHYARD_STATUS_PANIC with its what() and
// poisons the instance: every later call answers SWITCHYARD_STATUS_POISONED.
//
// Threading: the host calls one instance from one thread at a time.
#ifndef SWITCHYARD_PLUGIN_HPP
#define SWITCHYARD_PLUGIN_HPP

#include <switchyard/plugin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace switchyard {

// Input groups a component reads (bit set of SWITCHYARD_INPUT_*).
namespace inputs {
inline constexpr uint32_t none = 0;
inline constexpr uint32_t cache = SWITCHYARD_INPUT_CACHE;
inline constexpr uint32_t load = SWITCHYARD_INPUT_LOAD;
inline constexpr uint32_t routing = SWITCHYARD_INPUT_ROUTING;
// ABI 1.1: each candidate's labels, Candidates::label(row, key).
inline constexpr uint32_t labels = SWITCHYARD_INPUT_LABELS;
// ABI 1.2: the request's attributes, Request::attributes().
inline constexpr uint32_t attributes = SWITCHYARD_INPUT_ATTRIBUTES;
// ABI 1.2: engine-reported load and adapters, Candidates::engine(row) / adapter(row, name).
inline constexpr uint32_t engine = SWITCHYARD_INPUT_ENGINE;
}  // namespace inputs

// Fails one call with SWITCHYARD_STATUS_ERROR; does not poison the instance.
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
    virtual int32_t status() const noexcept { return SWITCHYARD_STATUS_ERROR; }
};

// Invalid parameters at create/validate time: SWITCHYARD_STATUS_INVALID_PARAMETERS.
class InvalidParameters : public Error {
public:
    using Error::Error;
    int32_t status() const noexcept override { return SWITCHYARD_STATUS_INVALID_PARAMETERS; }
};

enum class WorkerType : uint32_t {
    prefill = SWITCHYARD_WORKER_TYPE_PREFILL,
    decode = SWITCHYARD_WORKER_TYPE_DECODE,
    select = SWITCHYARD_WORKER_TYPE_SELECT,
};

enum class InputTrigger : uint32_t {
    none = SWITCHYARD_TRIGGER_NONE,
    user_message = SWITCHYARD_TRIGGER_USER_MESSAGE,
    tool_result = SWITCHYARD_TRIGGER_TOOL_RESULT,
    other = SWITCHYARD_TRIGGER_OTHER,
};

namespace detail {
inline std::string_view view(switchyard_str s) noexcept {
    return s.ptr == nullptr ? std::string_view() : std::string_view(s.ptr, s.len);
}
inline switchyard_str abi(std::string_view s) noexcept { return switchyard_str{s.data(), s.size()}; }
}  // namespace detail

// The router's log (ABI 1.5) for one factory or instance: lines name the plugin and its
// type, rate-limited per logger. Copy it into the object the call creates (it is valid
// until that object is destroyed); a default-constructed one logs nothing.
class Logger {
public:
    Logger() noexcept = default;
    explicit Logger(const switchyard_logger *raw) noexcept : raw_(raw) {}
    bool enabled(uint32_t level) const noexcept { return switchyard_log_enabled(raw_, level); }
    void log(uint32_t level, std::string_view message) const noexcept {
        if (enabled(level)) raw_->callback_log(raw_, level, detail::abi(message));
    }
    void error(std::string_view message) const noexcept { log(SWITCHYARD_LOG_ERROR, message); }
    void warn(std::string_view message) const noexcept { log(SWITCHYARD_LOG_WARN, message); }
    void info(std::string_view message) const noexcept { log(SWITCHYARD_LOG_INFO, message); }
    void debug(std::string_view message) const noexcept { log(SWITCHYARD_LOG_DEBUG, message); }
    void trace(std::string_view message) const noexcept { log(SWITCHYARD_LOG_TRACE, message); }

private:
    const switchyard_logger *raw_ = nullptr;
};

// Parameters of a component or policy. Borrowed: valid during create/validate only.
class Params {
public:
    explicit Params(const switchyard_params *raw) noexcept : raw_(raw) {}

    std::string_view json() const noexcept { return detail::view(raw_->json); }

    // The router's log for the object this call creates (ABI 1.5); logs nothing in an
    // older router.
    Logger logger() const noexcept { return Logger(switchyard_params_logger(raw_)); }

    // The router's built-in cost-model knobs (ABI 1.5; docs/default-policy.md), read-only;
    // empty in an older router or when the caller has none.
    std::optional<switchyard_router_settings> router_settings() const noexcept {
        const switchyard_router_settings *router = switchyard_params_router(raw_);
        if (router == nullptr) return std::nullopt;
        return *router;
    }

    std::vector<std::string_view> keys() const {
        std::vector<std::string_view> out;
        size_t count = raw_->callback_key_count(raw_);
        for (size_t i = 0; i < count; i++) {
            switchyard_str key{nullptr, 0};
            if (raw_->callback_key_at(raw_, i, &key) == SWITCHYARD_STATUS_OK) {
                out.push_back(detail::view(key));
            }
        }
        return out;
    }

    // Throws InvalidParameters naming the first key not in `allowed`.
    void allow_only(std::initializer_list<std::string_view> allowed) const {
        for (std::string_view key : keys()) {
            bool known = false;
            for (std::string_view a : allowed) {
                known = known || a == key;
            }
            if (!known) {
                std::string list;
                for (std::string_view a : allowed) {
                    list += (list.empty() ? "" : ", ") + std::string(a);
                }
                throw InvalidParameters("unknown parameter `" + std::string(key) + "`; expected " +
                                        (list.empty() ? std::string("none") : "one of: " + list));
            }
        }
    }

    // Empty when absent; throws InvalidParameters when present with another type.
    std::optional<double> number(std::string_view key) const {
        double out = 0.0;
        int32_t status = raw_->callback_get_number(raw_, detail::abi(key), &out);
        return get(status, key, "a number", out);
    }
    std::optional<bool> boolean(std::string_view key) const {
        uint8_t out = 0;
        int32_t status = raw_->callback_get_bool(raw_, detail::abi(key), &out);
        auto v = get(status, key, "a boolean", out);
        return v ? std::optional<bool>(*v != 0) : std::nullopt;
    }
    std::optional<std::string> string(std::string_view key) const {
        switchyard_str out{nullptr, 0};
        int32_t status = raw_->callback_get_string(raw_, detail::abi(key), &out);
        auto v = get(status, key, "a string", out);
        return v ? std::optional<std::string>(std::string(detail::view(*v))) : std::nullopt;
    }

private:
    template <class T>
    static std::optional<T> get(int32_t status, std::string_view key, const char *expected, T value) {
        if (status == SWITCHYARD_STATUS_OK) {
            return value;
        }
        if (status == SWITCHYARD_STATUS_NOT_FOUND) {
            return std::nullopt;
        }
        throw InvalidParameters("parameter `" + std::string(key) + "` must be " + expected);
    }
    const switchyard_params *raw_;
};

// The partition an instance is created for. Borrowed: valid during the call.
class Partition {
public:
    explicit Partition(const switchyard_partition *raw) noexcept : raw_(raw) {}
    WorkerType worker_type() const noexcept { return static_cast<WorkerType>(raw_->worker_type); }
    std::string_view model() const noexcept { return detail::view(raw_->model); }

private:
    const switchyard_partition *raw_;
};

// Session metadata of a request.
class Session {
public:
    explicit Session(const switchyard_session *raw) noexcept : raw_(raw) {}
    std::string_view session_id() const noexcept { return detail::view(raw_->session_id); }
    std::optional<std::string_view> parent_session_id() const noexcept {
        if (raw_->parent_session_id.ptr == nullptr) return std::nullopt;
        return detail::view(raw_->parent_session_id);
    }
    std::optional<bool> session_final() const noexcept {
        if (raw_->has_session_final == 0) return std::nullopt;
        return raw_->session_final != 0;
    }
    // Present when the request carries KV hints.
    std::optional<bool> evict_session() const noexcept {
        if (raw_->has_kv_hints == 0) return std::nullopt;
        return raw_->evict_session != 0;
    }
    InputTrigger input_trigger() const noexcept { return static_cast<InputTrigger>(raw_->input_trigger); }

private:
    const switchyard_session *raw_;
};

// What the request says about itself (ABI 1.2, ATTRIBUTES). Borrowed for the call.
class Attributes {
public:
    explicit Attributes(const switchyard_request_attributes *raw) noexcept : raw_(raw) {}
    std::string_view request_id() const noexcept { return detail::view(raw_->request_id); }
    std::string_view model() const noexcept { return detail::view(raw_->model); }
    std::optional<std::string_view> lora_adapter() const noexcept { return optional(raw_->lora_adapter); }
    std::optional<std::string_view> tenant() const noexcept { return optional(raw_->tenant); }
    // A header the operator listed in `request_attributes.headers` (case-insensitive).
    std::optional<std::string_view> header(std::string_view name) const noexcept {
        switchyard_str out{nullptr, 0};
        if (raw_->callback_get_header == nullptr ||
            raw_->callback_get_header(raw_, detail::abi(name), &out) != SWITCHYARD_STATUS_OK) {
            return std::nullopt;
        }
        return detail::view(out);
    }

private:
    static std::optional<std::string_view> optional(switchyard_str s) noexcept {
        if (s.ptr == nullptr) return std::nullopt;
        return detail::view(s);
    }
    const switchyard_request_attributes *raw_;
};

// The worker a request's session is bound to (ABI 1.5, `router.session_affinity`).
struct AffinityTarget {
    uint64_t worker_id;
    uint32_t dp_rank;
    bool hard;  // false: soft
};

// The request being routed. Borrowed: valid during the call.
class Request {
public:
    explicit Request(const switchyard_request *raw) noexcept : raw_(raw) {}
    uint64_t request_blocks() const noexcept { return raw_->request_blocks; }
    uint32_t block_size() const noexcept { return raw_->block_size; }
    bool tracks_prefill_tokens() const noexcept { return raw_->tracks_prefill_tokens != 0; }
    std::optional<uint64_t> expected_output_tokens() const noexcept {
        if (raw_->has_expected_output_tokens == 0) return std::nullopt;
        return raw_->expected_output_tokens;
    }
    double priority_jump() const noexcept { return raw_->priority_jump; }
    int32_t strict_priority() const noexcept { return raw_->strict_priority; }
    std::optional<double> router_temperature_override() const noexcept {
        if (raw_->has_router_temperature_override == 0) return std::nullopt;
        return raw_->router_temperature_override;
    }
    std::optional<Session> session() const noexcept {
        if (raw_->session == nullptr) return std::nullopt;
        return Session(raw_->session);
    }
    // The session's binding (ABI 1.5); empty without one or in a router older than 1.5.
    // Advisory: the worker may be absent from the candidates.
    std::optional<AffinityTarget> affinity_target() const noexcept {
        AffinityTarget target{0, 0, false};
        uint32_t mode = switchyard_request_affinity(raw_, &target.worker_id, &target.dp_rank);
        if (mode == SWITCHYARD_AFFINITY_NONE) return std::nullopt;
        target.hard = mode == SWITCHYARD_AFFINITY_HARD;
        return target;
    }
    // ATTRIBUTES (ABI 1.2); throws std::logic_error when the component did not declare
    // the group or the router is older than 1.2.
    Attributes attributes() const {
        const switchyard_request_attributes *a = switchyard_request_attrs(raw_);
        if (a == nullptr) {
            throw std::logic_error("the component did not declare the ATTRIBUTES input group (router ABI >= 1.2)");
        }
        return Attributes(a);
    }

private:
    const switchyard_request *raw_;
};

// A read-only column of the candidates: one value per row.
template <class T>
class Column {
public:
    Column(const T *values, size_t size) noexcept : values_(values), size_(size) {}
    T operator[](size_t row) const noexcept { return values_[row]; }
    size_t size() const noexcept { return size_; }
    const T *begin() const noexcept { return values_; }
    const T *end() const noexcept { return values_ + size_; }

private:
    const T *values_;
    size_t size_;
};

// All candidates of one call. Reading a group the component did not declare throws
// std::logic_error (which poisons the instance: it is a bug in the component). Each
// signal is available per row, `device_overlap_blocks(row)`, or as a whole column,
// `device_overlap_blocks()`, checked once: the fast form for batch methods.
class Candidates {
public:
    explicit Candidates(const switchyard_candidates *raw) noexcept : raw_(raw) {}
    size_t size() const noexcept { return raw_->count; }
    uint64_t worker_id(size_t row) const noexcept { return raw_->worker_id[row]; }
    uint32_t dp_rank(size_t row) const noexcept { return raw_->dp_rank[row]; }
    Column<uint64_t> worker_id() const noexcept { return {raw_->worker_id, raw_->count}; }
    Column<uint32_t> dp_rank() const noexcept { return {raw_->dp_rank, raw_->count}; }

    Column<uint32_t> device_overlap_blocks() const { return column(raw_->device_overlap_blocks, "CACHE"); }
    Column<uint32_t> host_overlap_blocks() const { return column(raw_->host_overlap_blocks, "CACHE"); }
    Column<uint32_t> disk_overlap_blocks() const { return column(raw_->disk_overlap_blocks, "CACHE"); }
    Column<uint32_t> shared_beyond_device_blocks() const { return column(raw_->shared_beyond_device_blocks, "CACHE"); }
    Column<uint64_t> active_prefill_tokens() const { return column(raw_->active_prefill_tokens, "LOAD"); }
    Column<uint64_t> decode_cost_blocks() const { return column(raw_->decode_cost_blocks, "LOAD"); }
    Column<uint32_t> active_requests() const { return column(raw_->active_requests, "LOAD"); }
    // NaN where a worker has no multiplier.
    Column<double> preferred_taint_multiplier() const { return column(raw_->preferred_taint_multiplier, "ROUTING"); }
    // Picker calls only: the total cost of each row.
    Column<double> costs() const {
        if (raw_->costs == nullptr) throw std::logic_error("costs are available to pickers only");
        return {raw_->costs, raw_->count};
    }

    uint32_t device_overlap_blocks(size_t row) const { return device_overlap_blocks()[row]; }
    uint32_t host_overlap_blocks(size_t row) const { return host_overlap_blocks()[row]; }
    uint32_t disk_overlap_blocks(size_t row) const { return disk_overlap_blocks()[row]; }
    uint32_t shared_beyond_device_blocks(size_t row) const { return shared_beyond_device_blocks()[row]; }
    uint64_t active_prefill_tokens(size_t row) const { return active_prefill_tokens()[row]; }
    uint64_t decode_cost_blocks(size_t row) const { return decode_cost_blocks()[row]; }
    uint32_t active_requests(size_t row) const { return active_requests()[row]; }
    // Empty when the worker has no multiplier.
    std::optional<double> preferred_taint_multiplier(size_t row) const {
        double m = preferred_taint_multiplier()[row];
        return m != m ? std::nullopt : std::optional<double>(m);
    }
    double cost(size_t row) const { return costs()[row]; }

    // LABELS (ABI 1.1): the value of the worker's label `key`, empty when it has none.
    // Borrowed for the call.
    std::optional<std::string_view> label(size_t row, std::string_view key) const {
        if (raw_->struct_size < offsetof(switchyard_candidates, callback_get_label) + sizeof(void *)) {
            throw std::logic_error("labels need a router of ABI 1.1 or later");
        }
        if (raw_->callback_get_label == nullptr) {
            throw std::logic_error("the component did not declare the LABELS input group");
        }
        switchyard_str out{nullptr, 0};
        if (raw_->callback_get_label(raw_, row, detail::abi(key), &out) != SWITCHYARD_STATUS_OK) {
            return std::nullopt;
        }
        return detail::view(out);
    }

    // ENGINE (ABI 1.2): the engine's own report of its load; empty when it was never
    // scraped. Throws std::logic_error when the component did not declare ENGINE.
    std::optional<switchyard_engine_load> engine(size_t row) const {
        require_engine();
        switchyard_engine_load out{};
        if (switchyard_candidate_engine(raw_, row, &out) == 0) return std::nullopt;
        return out;
    }
    // ENGINE (ABI 1.2): SWITCHYARD_ADAPTER_RUNNING, SWITCHYARD_ADAPTER_WAITING, or 0.
    uint32_t adapter(size_t row, std::string_view name) const {
        require_engine();
        return switchyard_candidate_adapter(raw_, row, name.data(), name.size());
    }

private:
    void require_engine() const {
        if (!switchyard_candidates_have_engine(raw_)) {
            throw std::logic_error("the component did not declare the ENGINE input group (router ABI >= 1.2)");
        }
    }
    template <class T>
    Column<T> column(const T *values, const char *group) const {
        if (values == nullptr) {
            throw std::logic_error(std::string("the component did not declare the ") + group +
                                   " input group");
        }
        return {values, raw_->count};
    }
    const switchyard_candidates *raw_;
};

// One candidate row, for the per-candidate methods.
class Candidate {
public:
    Candidate(const Candidates &all, size_t row) noexcept : all_(all), row_(row) {}
    size_t row() const noexcept { return row_; }
    const Candidates &all() const noexcept { return all_; }
    uint64_t worker_id() const noexcept { return all_.worker_id(row_); }
    uint32_t dp_rank() const noexcept { return all_.dp_rank(row_); }
    uint32_t device_overlap_blocks() const { return all_.device_overlap_blocks(row_); }
    uint32_t host_overlap_blocks() const { return all_.host_overlap_blocks(row_); }
    uint32_t disk_overlap_blocks() const { return all_.disk_overlap_blocks(row_); }
    uint32_t shared_beyond_device_blocks() const { return all_.shared_beyond_device_blocks(row_); }
    uint64_t active_prefill_tokens() const { return all_.active_prefill_tokens(row_); }
    uint64_t decode_cost_blocks() const { return all_.decode_cost_blocks(row_); }
    uint32_t active_requests() const { return all_.active_requests(row_); }
    std::optional<double> preferred_taint_multiplier() const { return all_.preferred_taint_multiplier(row_); }
    std::optional<std::string_view> label(std::string_view key) const { return all_.label(row_, key); }

private:
    const Candidates &all_;
    size_t row_;
};

// What became of a routed request (ABI 1.1 lifecycle notifications). Borrowed.
class Outcome {
public:
    explicit Outcome(const switchyard_outcome *raw) noexcept : raw_(raw) {}
    // The router's id of the routed request: the same in all its notifications.
    uint64_t request_id() const noexcept { return raw_->request_id; }
    uint64_t worker_id() const noexcept { return raw_->worker_id; }
    uint32_t dp_rank() const noexcept { return raw_->dp_rank; }
    std::optional<double> seconds_to_prefill_complete() const noexcept { return known(raw_->seconds_to_prefill_complete); }
    std::optional<double> seconds_to_finish() const noexcept { return known(raw_->seconds_to_finish); }
    // ABI 1.4: the other worker of a disaggregated pair (the decode worker in a prefill
    // partition's notifications, the prefill worker in a decode partition's); nullopt for
    // a request served whole, before the other side is chosen, or from an older router.
    std::optional<uint64_t> paired_worker_id() const noexcept {
        if (raw_->struct_size < offsetof(switchyard_outcome, reserved0) ||
            raw_->paired_worker_id == SWITCHYARD_NO_WORKER)
            return std::nullopt;
        return raw_->paired_worker_id;
    }
    uint32_t paired_dp_rank() const noexcept {
        return raw_->struct_size < offsetof(switchyard_outcome, reserved0) ? 0 : raw_->paired_dp_rank;
    }

private:
    static std::optional<double> known(double v) noexcept { return v != v ? std::nullopt : std::optional<double>(v); }
    const switchyard_outcome *raw_;
};

// Lifecycle notifications (ABI 1.1), for every component kind. Override any of them in
// the concrete class: the layer sees the override at compile time and asks the router for
// just those; a component that overrides none costs the router nothing. Called with the
// instance's one-thread-at-a-time discipline; on_selected before the instance's next
// selection, the other two later, off the selection path.
class Lifecycle {
public:
    virtual ~Lifecycle() = default;
    // The request this instance helped route was booked on outcome.worker_id().
    virtual void on_selected(const Request &, const Outcome &) {}
    virtual void on_prefill_complete(const Outcome &) {}
    virtual void on_finished(const Outcome &) {}
};

// A hard requirement: keep or reject each worker.
class Filter : public Lifecycle {
public:
    virtual ~Filter() = default;
    virtual uint32_t required_inputs() const { return inputs::none; }
    virtual bool keep(const Request &request, const Candidate &candidate) = 0;
    // `out` has candidates.size() entries, all 1 on entry; set 0 to reject a row.
    virtual void keep_batch(const Request &request, const Candidates &candidates, uint8_t *out) {
        for (size_t row = 0; row < candidates.size(); row++) {
            out[row] = keep(request, Candidate(candidates, row)) ? 1 : 0;
        }
    }
};

// A preference: one finite cost per worker, lower is better.
class Scorer : public Lifecycle {
public:
    virtual ~Scorer() = default;
    virtual uint32_t required_inputs() const { return inputs::none; }
    virtual double score(const Request &request, const Candidate &candidate) = 0;
    // `costs` has candidates.size() entries, NaN on entry.
    virtual void score_batch(const Request &request, const Candidates &candidates, double *costs) {
        for (size_t row = 0; row < candidates.size(); row++) {
            costs[row] = score(request, Candidate(candidates, row));
        }
    }
};

// The final choice: one row of the scored candidates (candidates.cost(row) is available).
class Picker : public Lifecycle {
public:
    virtual ~Picker() = default;
    virtual uint32_t required_inputs() const { return inputs::none; }
    virtual size_t pick(const Request &request, const Candidates &candidates) = 0;
};

// How loaded the request's partition is as it arrives (ABI 1.3): healthy and busy
// workers, booked requests and prefill tokens, the queue (this tenant's and in all).
using Saturation = switchyard_saturation;

// An admitter's answer (ABI 1.3): admit (optionally at a priority, as a tenant, with a
// shorter wait) or reject with an HTTP status, Retry-After and a message.
class Admission {
public:
    static Admission admit() { return Admission(); }
    static Admission reject(uint32_t status, uint32_t retry_after_seconds, std::string message) {
        Admission a;
        a.reject_ = true;
        a.status_ = status;
        a.retry_after_ = retry_after_seconds;
        a.message_ = std::move(message);
        return a;
    }
    Admission &priority(int32_t priority) {
        priority_ = priority;
        return *this;
    }
    Admission &tenant(std::string tenant) {
        tenant_ = std::move(tenant);
        return *this;
    }
    Admission &max_wait_ms(uint64_t ms) {
        max_wait_ms_ = ms;
        return *this;
    }
    // Into the host's struct; `keep` holds the tenant until the instance's next call.
    void write(switchyard_admission *out, std::string &keep) const noexcept {
        if (reject_) {
            switchyard_admission_reject(out, status_, retry_after_, "%s", message_.c_str());
            return;
        }
        out->verdict = SWITCHYARD_ADMIT;
        if (priority_) switchyard_admission_set_priority(out, *priority_);
        if (tenant_) {
            keep = *tenant_;
            out->tenant = switchyard_str{keep.data(), keep.size()};
        }
        out->max_wait_ms = max_wait_ms_;
    }

private:
    bool reject_ = false;
    uint32_t status_ = 0;
    uint32_t retry_after_ = 0;
    std::string message_;
    std::optional<int32_t> priority_;
    std::optional<std::string> tenant_;
    uint64_t max_wait_ms_ = 0;
};

// Decides, before any worker is selected, whether a request is served (ABI 1.3). Reads
// only the request (declare inputs::attributes for its tenant and headers).
class Admitter {
public:
    virtual ~Admitter() = default;
    virtual uint32_t required_inputs() const { return inputs::none; }
    virtual Admission admit(const Request &request, const Saturation &saturation) = 0;
};

namespace detail {

inline void write_error(const switchyard_error *error, const char *message) noexcept {
    switchyard_error_printf(error, "%s", message);
}

// The instance behind the ABI: the component and its poison flag.
template <class Base>
struct Slot {
    std::unique_ptr<Base> component;
    bool poisoned = false;
    // An admitter's last tenant: valid until the instance's next call, as the ABI asks.
    std::string tenant;
};

// Runs `body` at the boundary. switchyard::Error -> its status; any other exception ->
// SWITCHYARD_STATUS_PANIC and, when `poisoned` is given, the instance is poisoned.
template <class Body>
int32_t guard(const switchyard_error *error, bool *poisoned, Body &&body) noexcept {
    if (poisoned != nullptr && *poisoned) {
        write_error(error, "instance is poisoned: it threw in an earlier call");
        return SWITCHYARD_STATUS_POISONED;
    }
    try {
        body();
        return SWITCHYARD_STATUS_OK;
    } catch (const Error &e) {
        write_error(error, e.what());
        return e.status();
    } catch (const std::exception &e) {
        if (poisoned != nullptr) *poisoned = true;
        switchyard_error_printf(error, "threw: %s", e.what());
        return SWITCHYARD_STATUS_PANIC;
    } catch (...) {
        if (poisoned != nullptr) *poisoned = true;
        write_error(error, "threw a non-standard exception");
        return SWITCHYARD_STATUS_PANIC;
    }
}

template <class Base>
inline void destroy(void *instance) noexcept {
    delete static_cast<Slot<Base> *>(instance);
}

inline int32_t on_filter(void *instance, const switchyard_request *request,
                         const switchyard_candidates *candidates, uint8_t *keep,
                         const switchyard_error *error) noexcept {
    auto *slot = static_cast<Slot<Filter> *>(instance);
    return guard(error, &slot->poisoned,
                 [&] { slot->component->keep_batch(Request(request), Candidates(candidates), keep); });
}

inline int32_t on_score(void *instance, const switchyard_request *request,
                        const switchyard_candidates *candidates, double *costs,
                        const switchyard_error *error) noexcept {
    auto *slot = static_cast<Slot<Scorer> *>(instance);
    return guard(error, &slot->poisoned,
                 [&] { slot->component->score_batch(Request(request), Candidates(candidates), costs); });
}

inline int32_t on_pick(void *instance, const switchyard_request *request,
                       const switchyard_candidates *candidates, size_t *out_row,
                       const switchyard_error *error) noexcept {
    auto *slot = static_cast<Slot<Picker> *>(instance);
    return guard(error, &slot->poisoned, [&] {
        size_t row = slot->component->pick(Request(request), Candidates(candidates));
        *out_row = row;
    });
}

inline int32_t on_admit(void *instance, const switchyard_request *request,
                        const switchyard_saturation *saturation, switchyard_admission *decision,
                        const switchyard_error *error) noexcept {
    auto *slot = static_cast<Slot<Admitter> *>(instance);
    return guard(error, &slot->poisoned, [&] {
        slot->component->admit(Request(request), *saturation).write(decision, slot->tenant);
    });
}

template <class Base>
int32_t on_selected(void *instance, const switchyard_request *request, const switchyard_outcome *outcome,
                    const switchyard_error *error) noexcept {
    auto *slot = static_cast<Slot<Base> *>(instance);
    return guard(error, &slot->poisoned, [&] { slot->component->on_selected(Request(request), Outcome(outcome)); });
}
template <class Base>
int32_t on_prefill_complete(void *instance, const switchyard_outcome *outcome, const switchyard_error *error) noexcept {
    auto *slot = static_cast<Slot<Base> *>(instance);
    return guard(error, &slot->poisoned, [&] { slot->component->on_prefill_complete(Outcome(outcome)); });
}
template <class Base>
int32_t on_finished(void *instance, const switchyard_outcome *outcome, const switchyard_error *error) noexcept {
    auto *slot = static_cast<Slot<Base> *>(instance);
    return guard(error, &slot->poisoned, [&] { slot->component->on_finished(Outcome(outcome)); });
}

// Sets the notification callbacks T overrides (a member of T itself, not of Lifecycle).
template <class Base, class T>
void install_lifecycle(switchyard_component_def &def) noexcept {
    using Selected = decltype(&T::on_selected);
    using Prefill = decltype(&T::on_prefill_complete);
    using Finished = decltype(&T::on_finished);
    if constexpr (!std::is_same_v<Selected, decltype(&Lifecycle::on_selected)>) def.on_selected = on_selected<Base>;
    if constexpr (!std::is_same_v<Prefill, decltype(&Lifecycle::on_prefill_complete)>)
        def.on_prefill_complete = on_prefill_complete<Base>;
    if constexpr (!std::is_same_v<Finished, decltype(&Lifecycle::on_finished)>) def.on_finished = on_finished<Base>;
}

// The input groups T declares once, as `static constexpr uint32_t input_groups`.
template <class T, class = void>
struct declared_groups : std::false_type {};
template <class T>
struct declared_groups<T, std::void_t<decltype(T::input_groups)>> : std::true_type {};
template <class T>
constexpr uint32_t static_groups() {
    if constexpr (declared_groups<T>::value) {
        return T::input_groups;
    } else {
        return 0;
    }
}

template <class Base>
struct Kind;
template <>
struct Kind<Filter> {
    static constexpr uint32_t value = SWITCHYARD_COMPONENT_FILTER;
    static void install(switchyard_component_def &def) noexcept { def.on_filter = on_filter; }
};
template <>
struct Kind<Scorer> {
    static constexpr uint32_t value = SWITCHYARD_COMPONENT_SCORER;
    static void install(switchyard_component_def &def) noexcept { def.on_score = on_score; }
};
template <>
struct Kind<Picker> {
    static constexpr uint32_t value = SWITCHYARD_COMPONENT_PICKER;
    static void install(switchyard_component_def &def) noexcept { def.on_pick = on_pick; }
};
template <>
struct Kind<Admitter> {
    static constexpr uint32_t value = SWITCHYARD_COMPONENT_ADMITTER;
    static void install(switchyard_component_def &def) noexcept { def.on_admit = on_admit; }
};

template <class Base>
switchyard_component_def component_def(const char *type_name, uint32_t inputs) noexcept {
    switchyard_component_def def;
    std::memset(&def, 0, sizeof def);
    def.struct_size = sizeof(switchyard_component_def);
    def.kind = Kind<Base>::value;
    def.inputs = inputs;
    def.type_name = type_name;
    def.on_destroy = destroy<Base>;
    Kind<Base>::install(def);
    return def;
}

// "cache, load", or "none".
inline std::string group_names(uint32_t groups) {
    std::string names;
    const std::pair<uint32_t, const char *> all[] = {
        {inputs::cache, "cache"},   {inputs::load, "load"},     {inputs::routing, "routing"},
        {inputs::labels, "labels"}, {inputs::attributes, "attributes"}, {inputs::engine, "engine"}};
    for (const auto &group : all) {
        if ((groups & group.first) != 0) names += (names.empty() ? "" : ", ") + std::string(group.second);
    }
    return names.empty() ? "none" : names;
}

template <class Base>
void check_inputs(const Base &component, uint32_t declared) {
    uint32_t required = component.required_inputs();
    if ((required & ~declared) != 0) {
        throw InvalidParameters("the component's required_inputs() asks for " + group_names(required) +
                                " but its type was registered with " + group_names(declared) + ": register it with " +
                                group_names(required | declared) +
                                " (and declare the same in its SWITCHYARD_DECLARE_* manifest line)");
    }
}

// Creates a T from (Params, Partition) for a registered type; `user_data` holds the
// declared input groups.
template <class Base, class T>
int32_t on_create(void *user_data, const switchyard_params *params, const switchyard_partition *partition,
                  void **out_instance, const switchyard_error *error) noexcept {
    return guard(error, nullptr, [&] {
        auto slot = std::make_unique<Slot<Base>>();
        slot->component = std::make_unique<T>(Params(params), Partition(partition));
        check_inputs(*slot->component, static_cast<uint32_t>(reinterpret_cast<uintptr_t>(user_data)));
        *out_instance = slot.release();
    });
}

}  // namespace detail

// Handed to PolicyFactory::build: add the partition's components here, filters and
// scorers in order, then exactly one picker.
class PolicyBuilder {
public:
    PolicyBuilder(const switchyard_policy_builder *raw, const switchyard_error *error, std::string prefix) noexcept
        : raw_(raw), error_(error), prefix_(std::move(prefix)) {}

    // T is the concrete class (as std::make_unique<T> gives it): its lifecycle overrides
    // are seen here.
    template <class T>
    void add_filter(std::unique_ptr<T> filter) {
        add<Filter, T>(std::move(filter), "filter." + std::to_string(filters_++), 1.0);
    }
    template <class T>
    void add_scorer(std::unique_ptr<T> scorer, double weight = 1.0) {
        add<Scorer, T>(std::move(scorer), "scorer." + std::to_string(scorers_++), weight);
    }
    template <class T>
    void set_picker(std::unique_ptr<T> picker) {
        add<Picker, T>(std::move(picker), "picker", 1.0);
    }

    // ABI 1.1: adds a registered component type, built-in or any plugin's, created by the
    // router: add_registered("builtin.lowest-cost"), add_registered("acme.zone", R"({"zone":"a"})").
    void add_registered(const char *type_name, const char *params_json = "{}", double weight = 1.0) {
        int32_t status = switchyard_builder_add_registered(raw_, type_name, params_json, weight, error_);
        if (status != SWITCHYARD_STATUS_OK) {
            throw Error(error_->buffer);
        }
    }

private:
    template <class Base, class T>
    void add(std::unique_ptr<T> component, const std::string &part, double weight) {
        static_assert(std::is_base_of_v<Base, T>, "add_filter/add_scorer/set_picker: wrong component kind");
        std::string name = prefix_ + "/" + part;
        uint32_t groups = component->required_inputs() | detail::static_groups<T>();
        switchyard_component_def def = detail::component_def<Base>(name.c_str(), groups);
        detail::install_lifecycle<Base, T>(def);
        auto slot = std::make_unique<detail::Slot<Base>>();
        slot->component = std::unique_ptr<Base>(std::move(component));
        // The host owns the instance from this call on, whatever the status.
        int32_t status = raw_->callback_add_component(raw_, &def, slot.release(), weight, error_);
        if (status != SWITCHYARD_STATUS_OK) {
            throw Error(error_->buffer);
        }
    }
    const switchyard_policy_builder *raw_;
    const switchyard_error *error_;
    std::string prefix_;
    int filters_ = 0;
    int scorers_ = 0;
};

// A validated policy: constructed once from its parameters (throw InvalidParameters to
// refuse them), then asked to build the components of each partition.
class PolicyFactory {
public:
    virtual ~PolicyFactory() = default;
    virtual void build(const Partition &partition, PolicyBuilder &builder) = 0;
};

namespace detail {

struct FactorySlot {
    std::unique_ptr<PolicyFactory> factory;
    std::string type_name;
};

template <class T>
int32_t on_validate(void *user_data, const switchyard_params *params, void **out_factory,
                    const switchyard_error *error) noexcept {
    return guard(error, nullptr, [&] {
        auto slot = std::make_unique<FactorySlot>();
        slot->factory = std::make_unique<T>(Params(params));
        slot->type_name = static_cast<const char *>(user_data);
        *out_factory = slot.release();
    });
}

inline void on_destroy_factory(void *factory) noexcept { delete static_cast<FactorySlot *>(factory); }

inline int32_t on_build(void *factory, const switchyard_partition *partition, const switchyard_policy_builder *builder,
                        const switchyard_error *error) noexcept {
    auto *slot = static_cast<FactorySlot *>(factory);
    return guard(error, nullptr, [&] {
        PolicyBuilder b(builder, error, slot->type_name);
        slot->factory->build(Partition(partition), b);
    });
}

}  // namespace detail

// Handed to the plugin's register function.
class Registrar {
public:
    Registrar(const switchyard_registrar *raw, const switchyard_error *error) noexcept : raw_(raw), error_(error) {}

    uint32_t host_abi_minor() const noexcept { return raw_->host_abi_minor; }

    // T must be constructible from (const Params&, const Partition&) and read only the
    // groups in `inputs`.
    template <class T>
    void filter(const char *type_name, uint32_t inputs) { component<Filter, T>(type_name, inputs); }
    template <class T>
    void scorer(const char *type_name, uint32_t inputs) { component<Scorer, T>(type_name, inputs); }
    template <class T>
    void picker(const char *type_name, uint32_t inputs) { component<Picker, T>(type_name, inputs); }
    // ABI 1.3: T derives from Admitter; list the type in `admission.admitters`.
    template <class T>
    void admitter(const char *type_name, uint32_t inputs) { component<Admitter, T>(type_name, inputs); }

    // Input groups declared once, in the class: `static constexpr uint32_t input_groups =
    // switchyard::inputs::load;`. required_inputs() need not be overridden then.
    template <class T>
    void filter(const char *type_name) { component<Filter, T>(type_name, groups_of<T>()); }
    template <class T>
    void scorer(const char *type_name) { component<Scorer, T>(type_name, groups_of<T>()); }
    template <class T>
    void picker(const char *type_name) { component<Picker, T>(type_name, groups_of<T>()); }
    template <class T>
    void admitter(const char *type_name) { component<Admitter, T>(type_name, groups_of<T>()); }

    // T derives from PolicyFactory and is constructible from (const Params&).
    // `type_name` must be a string literal (it is kept for naming the built components).
    template <class T>
    void policy(const char *type_name) {
        switchyard_policy_def def;
        std::memset(&def, 0, sizeof def);
        def.struct_size = sizeof(switchyard_policy_def);
        def.type_name = type_name;
        def.user_data = const_cast<char *>(type_name);
        def.on_validate = detail::on_validate<T>;
        def.on_destroy_factory = detail::on_destroy_factory;
        def.on_build = detail::on_build;
        check(raw_->callback_register_policy(raw_, &def, error_));
    }

private:
    template <class T>
    static constexpr uint32_t groups_of() {
        static_assert(detail::declared_groups<T>::value,
                      "register without input groups only a class that declares them: "
                      "static constexpr uint32_t input_groups = switchyard::inputs::...;");
        return T::input_groups;
    }
    template <class Base, class T>
    void component(const char *type_name, uint32_t inputs) {
        switchyard_component_def def = detail::component_def<Base>(type_name, inputs);
        if constexpr (!std::is_same_v<Base, Admitter>) detail::install_lifecycle<Base, T>(def);
        def.user_data = reinterpret_cast<void *>(static_cast<uintptr_t>(inputs));
        def.on_create = detail::on_create<Base, T>;
        check(raw_->callback_register_component(raw_, &def, error_));
    }
    void check(int32_t status) const {
        if (status != SWITCHYARD_STATUS_OK) throw Error(error_->buffer);
    }
    const switchyard_registrar *raw_;
    const switchyard_error *error_;
};

namespace detail {
inline int32_t run_register(const switchyard_registrar *registrar, const switchyard_error *error,
                            void (*register_fn)(Registrar &)) noexcept {
    return guard(error, nullptr, [&] {
        Registrar r(registrar, error);
        register_fn(r);
    });
}
}  // namespace detail

}  // namespace switchyard

// Defines the descriptor and exports `switchyard_plugin_entry_v1`; use once per library.
// `register_fn` is a `void(switchyard::Registrar&)`.
#define SWITCHYARD_CPP_PLUGIN(name, version, vendor, register_fn)                                   \
    static int32_t switchyard_cpp_on_register_(const switchyard_registrar *registrar,            \
                                               const switchyard_error *error) {                  \
        return ::switchyard::detail::run_register(registrar, error, register_fn);                 \
    }                                                                                             \
    SWITCHYARD_PLUGIN(name, version, vendor, switchyard_cpp_on_register_)

#endif  // SWITCHYARD_PLUGIN_HPP
