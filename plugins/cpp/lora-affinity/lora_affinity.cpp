// A LoRA-aware scorer in C++ with ABI 1.2's two new input groups: the request's adapter
// (ATTRIBUTES) and each engine's own report of the adapters it runs and of its queue
// (ENGINE, scraped from the engine's /metrics by the router).
//
// cost = adapter_cost * (0 where the adapter runs, 0.5 where it waits, 1 elsewhere)
//      + queue_cost * (waiting + running requests the engine reports)
//
// so a request goes to an engine that already has its adapter loaded unless that engine's
// queue outweighs the adapter swap. Without an engine sample (never scraped, or older than
// `max_age_ms`) a worker costs what an engine without the adapter and with its booked
// requests would.
#include <cmath>
#include <string>

#include <switchyard/plugin.hpp>

namespace {

using namespace switchyard;

double non_negative(const Params &params, const char *key, double fallback) {
    double value = params.number(key).value_or(fallback);
    if (!std::isfinite(value) || value < 0.0) {
        throw InvalidParameters(std::string(key) + " must be a finite non-negative number, got " +
                                std::to_string(value));
    }
    return value;
}

class LoraAffinity final : public Scorer {
public:
    LoraAffinity(const Params &params, const Partition &) {
        params.allow_only({"adapter_cost", "queue_cost", "max_age_ms"});
        adapter_cost_ = non_negative(params, "adapter_cost", 8.0);
        queue_cost_ = non_negative(params, "queue_cost", 1.0);
        max_age_seconds_ = non_negative(params, "max_age_ms", 5000.0) / 1000.0;
    }
    uint32_t required_inputs() const override { return inputs::engine | inputs::load | inputs::attributes; }
    double score(const Request &request, const Candidate &c) override {
        const Candidates &all = c.all();
        auto engine = all.engine(c.row());
        bool fresh = engine && engine->sample_age_seconds <= max_age_seconds_;
        double queue = fresh ? engine->waiting_requests + std::max(engine->running_requests,
                                                                   double(c.active_requests()))
                             : double(c.active_requests());
        double adapter = 0.0;
        if (auto name = request.attributes().lora_adapter()) {
            uint32_t state = fresh ? all.adapter(c.row(), *name) : 0;
            adapter = state == SWITCHYARD_ADAPTER_RUNNING ? 0.0 : state == SWITCHYARD_ADAPTER_WAITING ? 0.5 : 1.0;
        }
        return adapter_cost_ * adapter + queue_cost_ * queue;
    }

private:
    double adapter_cost_ = 8.0;
    double queue_cost_ = 1.0;
    double max_age_seconds_ = 5.0;
};

void register_types(Registrar &registrar) {
    registrar.scorer<LoraAffinity>("cpp.lora-affinity", inputs::engine | inputs::load | inputs::attributes);
}

}  // namespace

SWITCHYARD_DECLARE_SCORER("cpp.lora-affinity", inputs::engine | inputs::load | inputs::attributes)

SWITCHYARD_CPP_PLUGIN("acme-lora-affinity-cpp", "0.1.0", "Acme Corp (switchyard example)", register_types)
