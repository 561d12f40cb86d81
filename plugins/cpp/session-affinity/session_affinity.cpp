// Session affinity as a C++ policy with per-instance state in STL containers.
//
// Policy type `cpp.session-affinity`: a scorer that prefers the worker a session used
// last (cost 0 there, `affinity_weight` elsewhere), plus active requests, and a picker
// that takes the lowest cost and remembers the choice for the session. A request that
// says its session is final, or asks to evict it, is routed without preference and the
// session is forgotten. The table is shared by the instance's scorer and picker only:
// one table per partition, as the host creates one policy per partition.
//
// Scorer `cpp.sticky-session` (ABI 1.1) does the same standalone, beside any other
// components and any picker (a built-in one included): it learns where each session went
// from the router's `on_selected` notification instead of from its own picker, so it
// needs no partner component. It declares its input groups once (`input_groups`).
//
// Also registers `cpp.throwing-scorer`, a scorer that throws on every call once its
// `throw_after` calls are used up: a fixture for fault-containment tests and demos.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

#include <switchyard/plugin.hpp>

namespace {

using namespace switchyard;

struct WorkerKey {
    uint64_t worker_id;
    uint32_t dp_rank;
};

// session id -> the worker it was routed to last.
using SessionTable = std::unordered_map<std::string, WorkerKey>;

bool ends_session(const Request &request) {
    auto session = request.session();
    return session && (session->session_final().value_or(false) || session->evict_session().value_or(false));
}

class AffinityScorer final : public Scorer {
public:
    AffinityScorer(std::shared_ptr<SessionTable> table, double weight) : table_(std::move(table)), weight_(weight) {}
    uint32_t required_inputs() const override { return inputs::load; }
    double score(const Request &, const Candidate &) override { return 0.0; }
    void score_batch(const Request &request, const Candidates &c, double *costs) override {
        auto session = request.session();
        auto last = session ? table_->find(std::string(session->session_id())) : table_->end();
        bool prefer = last != table_->end() && !ends_session(request);
        for (size_t row = 0; row < c.size(); row++) {
            bool sticky = prefer && c.worker_id(row) == last->second.worker_id && c.dp_rank(row) == last->second.dp_rank;
            costs[row] = (sticky ? 0.0 : (prefer ? weight_ : 0.0)) + c.active_requests(row);
        }
    }

private:
    std::shared_ptr<SessionTable> table_;
    double weight_;
};

class RememberingPicker final : public Picker {
public:
    explicit RememberingPicker(std::shared_ptr<SessionTable> table) : table_(std::move(table)) {}
    size_t pick(const Request &request, const Candidates &c) override {
        if (c.size() == 0) throw Error("no eligible worker");
        size_t best = 0;
        for (size_t row = 1; row < c.size(); row++) {
            if (std::make_tuple(c.cost(row), c.worker_id(row), c.dp_rank(row)) <
                std::make_tuple(c.cost(best), c.worker_id(best), c.dp_rank(best))) {
                best = row;
            }
        }
        if (auto session = request.session()) {
            std::string id(session->session_id());
            if (ends_session(request)) {
                table_->erase(id);
            } else {
                (*table_)[id] = WorkerKey{c.worker_id(best), c.dp_rank(best)};
            }
        }
        return best;
    }

private:
    std::shared_ptr<SessionTable> table_;
};

class SessionAffinity final : public PolicyFactory {
public:
    explicit SessionAffinity(const Params &params) {
        params.allow_only({"affinity_weight"});
        weight_ = params.number("affinity_weight").value_or(4.0);
        if (!std::isfinite(weight_) || weight_ < 0.0) {
            throw InvalidParameters("affinity_weight must be a finite non-negative number");
        }
    }
    void build(const Partition &, PolicyBuilder &builder) override {
        auto table = std::make_shared<SessionTable>();
        builder.add_scorer(std::make_unique<AffinityScorer>(table, weight_));
        builder.set_picker(std::make_unique<RememberingPicker>(table));
    }

private:
    double weight_;
};

// Standalone: cost 0 on the worker the session was last routed to, `miss_cost` on the
// others; learns the routing from on_selected.
class StickySession final : public Scorer {
public:
    static constexpr uint32_t input_groups = inputs::none;

    StickySession(const Params &params, const Partition &) {
        params.allow_only({"miss_cost"});
        miss_cost_ = params.number("miss_cost").value_or(1.0);
        if (!std::isfinite(miss_cost_) || miss_cost_ < 0.0) {
            throw InvalidParameters("miss_cost must be a finite non-negative number");
        }
    }
    double score(const Request &, const Candidate &) override { return 0.0; }
    void score_batch(const Request &request, const Candidates &c, double *costs) override {
        auto session = request.session();
        auto last = session ? table_.find(std::string(session->session_id())) : table_.end();
        bool prefer = last != table_.end() && !ends_session(request);
        for (size_t row = 0; row < c.size(); row++) {
            bool sticky = prefer && c.worker_id(row) == last->second.worker_id && c.dp_rank(row) == last->second.dp_rank;
            costs[row] = prefer && !sticky ? miss_cost_ : 0.0;
        }
    }
    void on_selected(const Request &request, const Outcome &outcome) override {
        auto session = request.session();
        if (!session) return;
        std::string id(session->session_id());
        if (ends_session(request)) {
            table_.erase(id);
        } else {
            table_[id] = WorkerKey{outcome.worker_id(), outcome.dp_rank()};
        }
    }

private:
    SessionTable table_;
    double miss_cost_ = 1.0;
};

class ThrowingScorer final : public Scorer {
public:
    ThrowingScorer(const Params &params, const Partition &) {
        params.allow_only({"throw_after"});
        remaining_ = static_cast<long>(params.number("throw_after").value_or(0.0));
    }
    double score(const Request &, const Candidate &) override {
        if (remaining_-- <= 0) throw std::runtime_error("scorer state corrupted (deliberate test exception)");
        return 0.0;
    }
    void score_batch(const Request &request, const Candidates &c, double *costs) override {
        double cost = score(request, Candidate(c, 0));
        for (size_t row = 0; row < c.size(); row++) costs[row] = cost;
    }

private:
    long remaining_ = 0;
};

void register_types(Registrar &registrar) {
    registrar.policy<SessionAffinity>("cpp.session-affinity");
    registrar.scorer<StickySession>("cpp.sticky-session");
    registrar.scorer<ThrowingScorer>("cpp.throwing-scorer", inputs::none);
}

}  // namespace

SWITCHYARD_CPP_PLUGIN("acme-session-affinity-cpp", "0.1.0", "Acme Corp (switchyard example)", register_types)
