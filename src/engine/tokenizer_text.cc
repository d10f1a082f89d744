#include "engine/tokenizer_text.h"

#include "tokenizer/detokenizer.h"

namespace peregrine {

namespace {

class Choice final : public ChoiceText {
  public:
    Choice(std::shared_ptr<const Tokenizer> tok, const std::vector<int32_t>& prompt,
           const std::vector<std::string>& stops, bool skip_special)
        : tok_(std::move(tok)), detok_(*tok_, skip_special), stops_(stops), stop_strings_(stops) {
        detok_.prime(prompt);  // the continuation keeps its leading space
    }

    // A token past the tokenizer's vocabulary (the model's is padded, or --tokenizer is another
    // model's) has no text, as in vLLM.
    std::string push(int32_t token, std::string* stop) override {
        return filter(tok_->valid_id(token) ? detok_.push(token) : std::string(), stop);
    }

    std::string flush() override {
        std::string stop;
        std::string text = filter(detok_.finish(), &stop);
        if (stop.empty() && !stop_strings_.empty()) text += stops_.flush();
        return text;
    }

  private:
    std::string filter(const std::string& text, std::string* stop) {
        if (stop_strings_.empty()) return text;
        StopMatcher::Result r = stops_.push(text);
        if (r.matched) *stop = stop_strings_[r.stop_index];
        return std::move(r.emit);
    }

    std::shared_ptr<const Tokenizer> tok_;  // keeps the tokenizer alive for detok_
    IncrementalDetokenizer detok_;
    StopMatcher stops_;
    std::vector<std::string> stop_strings_;
};

}  // namespace

std::unique_ptr<ChoiceText> TokenizerText::start(const std::vector<int32_t>& prompt,
                                                 const std::vector<std::string>& stops, bool skip_special) const {
    return std::make_unique<Choice>(tokenizer_, prompt, stops, skip_special);
}

}  // namespace peregrine
