// A C++ scorer built out of tree: cost = queued prefill tokens / block size + decode blocks.
#include <switchyard/plugin.hpp>

namespace {

class QueueDepth final : public switchyard::Scorer {
public:
    QueueDepth(const switchyard::Params &params, const switchyard::Partition &) {
        params.allow_only({"decode_weight"});
        decode_weight_ = params.number("decode_weight").value_or(1.0);
    }
    uint32_t required_inputs() const override { return switchyard::inputs::load; }
    double score(const switchyard::Request &request, const switchyard::Candidate &c) override {
        return static_cast<double>(c.active_prefill_tokens()) / request.block_size() +
               decode_weight_ * static_cast<double>(c.decode_cost_blocks());
    }

private:
    double decode_weight_ = 1.0;
};

void register_types(switchyard::Registrar &registrar) {
    registrar.scorer<QueueDepth>("oot.queue-depth", switchyard::inputs::load);
}

}  // namespace

SWITCHYARD_CPP_PLUGIN("oot-queue-depth", "1.0.0", "out-of-tree test", register_types)
