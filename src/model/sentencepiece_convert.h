// Writes the tokenizer.json of a SentencePiece BPE model: the same pieces and
// ids, merges derived from the pieces' scores as Hugging Face derives them
// (every split of a piece into two pieces, ordered by the merged piece's
// score), byte fallback, and a normalizer that reproduces the model's own
// (the dummy "▁" prefix, and the removal of extra spaces where the model
// does it). The normalizer settings are read from SentencePiece's behaviour
// (libsentencepiece exposes no accessor for them), and the result is checked
// against SentencePiece on a probe set before it is returned.
#pragma once

#include <string>

#include "common/status.h"
#include "model/sentencepiece_tokenizer.h"

namespace failsafe {

// tokenizer.json text; an error if the derived tokenizer does not encode the
// probe texts exactly as SentencePiece does (e.g. a Unigram model).
Result<std::string> SentencePieceToTokenizerJson(const SentencePieceTokenizer& sp);

}  // namespace failsafe
