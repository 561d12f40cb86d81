// The reference's `least-busy` policy as a C++ plugin: keep workers with at least N
// device-resident overlap blocks, cost = active requests, pick the lowest cost (ties to
// the lowest worker id, so the choice does not depend on candidate order).
//
// Registers the policy type `cpp.least-busy` and its components standalone as
// `cpp.min-device-overlap`, `cpp.active-requests` and `cpp.lowest-cost`.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>

#include <switchyard/plugin.hpp>

namespace {

using namespace switchyard;

double non_negative(const Params &params, const char *key) {
    double value = params.number(key).value_or(0.0);
    if (!std::isfinite(value) || value < 0.0) {
        throw InvalidParameters(std::string(key) + " must be a finite non-negative number, got " +
                                std::to_string(value));
    }
    return value;
}

class MinDeviceOverlap final : public Filter {
public:
    explicit MinDeviceOverlap(double min_blocks) : min_blocks_(min_blocks) {}
    MinDeviceOverlap(const Params &params, const Partition &) {
        params.allow_only({"min_blocks"});
        min_blocks_ = non_negative(params, "min_blocks");
    }
    uint32_t required_inputs() const override { return inputs::cache; }
    bool keep(const Request &, const Candidate &c) override {
        return static_cast<double>(c.device_overlap_blocks()) >= min_blocks_;
    }
    // The batch form: one loop over the column, no virtual call per candidate.
    void keep_batch(const Request &, const Candidates &c, uint8_t *out) override {
        // Locals, not members: `out` is a byte array, which may alias `min_blocks_`, so
        // the compiler would reread it per row. Compared in the column's own type (d >= m
        // exactly when d >= ceil(m), for whole blocks d): a 32-bit comparison vectorizes
        // where a double (or 64-bit) one does not.
        auto device = c.device_overlap_blocks();
        const uint32_t *blocks = device.begin();
        const size_t count = device.size();
        if (min_blocks_ > 4294967295.0) {
            std::fill(out, out + count, uint8_t{0});  // more than any worker can hold
            return;
        }
        const auto threshold = static_cast<uint32_t>(std::ceil(min_blocks_));
        for (size_t row = 0; row < count; row++) {
            out[row] = blocks[row] >= threshold;
        }
    }

private:
    double min_blocks_ = 0.0;
};

class ActiveRequests final : public Scorer {
public:
    ActiveRequests() = default;
    ActiveRequests(const Params &params, const Partition &) { params.allow_only({}); }
    uint32_t required_inputs() const override { return inputs::load; }
    double score(const Request &, const Candidate &c) override { return c.active_requests(); }
    void score_batch(const Request &, const Candidates &c, double *costs) override {
        auto active = c.active_requests();
        for (size_t row = 0; row < active.size(); row++) costs[row] = active[row];
    }
};

class LowestCost final : public Picker {
public:
    LowestCost() = default;
    LowestCost(const Params &params, const Partition &) { params.allow_only({}); }
    size_t pick(const Request &, const Candidates &c) override {
        if (c.size() == 0) throw Error("no eligible worker");
        auto costs = c.costs();
        auto ids = c.worker_id();
        auto ranks = c.dp_rank();
        const size_t count = costs.size();
        // Two passes. First the lowest cost alone, in eight independent lanes: no branch,
        // no id read, and no lane waits on another. The host hands pickers finite costs.
        double lanes[8];
        std::fill(std::begin(lanes), std::end(lanes), costs[0]);
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
        const double lowest = *std::min_element(std::begin(lanes), std::end(lanes));
        // Then the lowest (worker_id, dp_rank) among the rows at that cost, four rows at a
        // time: most quads hold none, which their own minimum (above `lowest`) tells in one
        // comparison.
        size_t best = count;
        for (size_t start = 0; start < count; start += 4) {
            const size_t end = std::min(start + 4, count);
            if (end - start == 4) {
                const double *quad = costs.begin() + start;
                double low = quad[0] < quad[1] ? quad[0] : quad[1];
                low = quad[2] < low ? quad[2] : low;
                low = quad[3] < low ? quad[3] : low;
                if (low > lowest) continue;
            }
            for (size_t r = start; r < end; r++) {
                if (costs[r] == lowest &&
                    (best == count ||
                     std::make_tuple(ids[r], ranks[r]) < std::make_tuple(ids[best], ranks[best]))) {
                    best = r;
                }
            }
        }
        if (best == count) throw Error("no finite lowest cost");
        return best;
    }
};

class LeastBusy final : public PolicyFactory {
public:
    explicit LeastBusy(const Params &params) {
        params.allow_only({"min_device_overlap_blocks"});
        min_blocks_ = non_negative(params, "min_device_overlap_blocks");
    }
    void build(const Partition &, PolicyBuilder &builder) override {
        builder.add_filter(std::make_unique<MinDeviceOverlap>(min_blocks_));
        builder.add_scorer(std::make_unique<ActiveRequests>());
        builder.set_picker(std::make_unique<LowestCost>());
    }

private:
    double min_blocks_;
};

void register_types(Registrar &registrar) {
    registrar.policy<LeastBusy>("cpp.least-busy");
    registrar.filter<MinDeviceOverlap>("cpp.min-device-overlap", inputs::cache);
    registrar.scorer<ActiveRequests>("cpp.active-requests", inputs::load);
    registrar.picker<LowestCost>("cpp.lowest-cost", inputs::none);
}

}  // namespace

// What register_types registers, for `switchyard plugin inspect` without loading.
SWITCHYARD_DECLARE_POLICY("cpp.least-busy")
SWITCHYARD_DECLARE_FILTER("cpp.min-device-overlap", inputs::cache)
SWITCHYARD_DECLARE_SCORER("cpp.active-requests", inputs::load)
SWITCHYARD_DECLARE_PICKER("cpp.lowest-cost", inputs::none)

SWITCHYARD_CPP_PLUGIN("acme-least-busy-cpp", "0.1.0", "Acme Corp (switchyard example)", register_types)
