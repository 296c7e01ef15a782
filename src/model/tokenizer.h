// Tokenizers: text <-> token ids, and what a model directory says about its
// text beside the vocabulary (special tokens, stop tokens, chat template).
//
// Two kinds of file are read:
//  - tokenizer.json (Hugging Face): BPE, byte-level (GPT-2, Llama-3, Qwen) or
//    SentencePiece-style with byte fallback (Llama-2, Mistral, Phi-3), with
//    its normalizers, pre-tokenizers, decoders and added tokens; see
//    hf_tokenizer.h. Text is read as Unicode: invalid UTF-8 becomes U+FFFD per
//    maximal invalid subpart, as the Python and JavaScript libraries do.
//  - tokenizer.model (SentencePiece), through libsentencepiece; see
//    sentencepiece_tokenizer.h.
// A directory may add tokenizer_config.json (special tokens, add_bos_token,
// chat_template), chat_template.jinja, generation_config.json (eos_token_id,
// an id or a list) and config.json's eos_token_id; LoadDir reads them all.
//
// Thread-safety: immutable after loading; Encode/Decode may run on any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/utf8.h"

namespace failsafe {

class ChatTemplate;
struct TokenizerConfig;

// Special token strings as a chat template sees them ("" when absent).
struct SpecialTokenStrings {
  std::string bos, eos, unk, pad;
  std::vector<std::string> additional;
};

class Tokenizer {
 public:
  virtual ~Tokenizer();

  // A tokenizer.json or tokenizer.model file (by its extension: .model is
  // SentencePiece, anything else tokenizer.json), without the files beside it.
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  // A model directory: tokenizer.json, else tokenizer.model, configured by
  // the files beside it. A chat template that uses an unsupported construct
  // is an error here, naming the construct.
  static Result<std::unique_ptr<Tokenizer>> LoadDir(const std::string& dir);
  // tokenizer.json text; `source` names the file in error messages.
  static Result<std::unique_ptr<Tokenizer>> Parse(std::string_view json_text,
                                                  const std::string& source);

  // add_special: the special tokens the tokenizer adds around a text (e.g. a
  // leading BOS). Special tokens written in the text are always recognised.
  // Stops early once more than `max_tokens` ids are out (at the end of a
  // word or of a stretch between special tokens): the result then has more
  // than max_tokens ids and is a prefix of the whole encoding (a
  // context-length check that need not tokenize a huge text whole).
  std::vector<int> Encode(std::string_view text, bool add_special = false,
                          size_t max_tokens = SIZE_MAX) const {
    return DoEncode(text, add_special, max_tokens);
  }
  // Valid UTF-8 text for the ids; special tokens are dropped when skip_special
  // is set. Ids outside the vocabulary decode to nothing.
  virtual std::string Decode(const std::vector<int>& ids, bool skip_special = false) const = 0;
  std::string DecodeOne(int id, bool skip_special = false) const {
    return Decode(std::vector<int>{id}, skip_special);
  }

  // One past the largest id.
  virtual int vocab_size() const = 0;
  // Id of a token or added token by its exact string, or -1.
  virtual int TokenId(std::string_view token) const = 0;
  virtual bool IsSpecial(int id) const = 0;
  int bos_id() const { return bos_id_; }

  const SpecialTokenStrings& special_tokens() const { return special_; }
  // Generation ends at any of these (generation_config.json, config.json and
  // tokenizer_config.json's eos_token); may be empty.
  const std::vector<int>& stop_token_ids() const { return stop_ids_; }
  // Null when the model has no chat template.
  const ChatTemplate* chat_template() const { return chat_template_.get(); }

 protected:
  Tokenizer() = default;
  // Applies the settings of tokenizer_config.json this kind understands.
  virtual Status Configure(const TokenizerConfig& config) = 0;
  virtual std::vector<int> DoEncode(std::string_view text, bool add_special,
                                    size_t max_tokens) const = 0;

  int bos_id_ = -1;
  SpecialTokenStrings special_;
  std::vector<int> stop_ids_;
  std::shared_ptr<const ChatTemplate> chat_template_;
};

// Turns generated ids into text as it becomes final: each call returns what
// the tokens so far add to the decoded text, holding back a character that
// later tokens may still complete, so streamed pieces concatenate to
// Decode(all ids). Decodes a short window, not the whole sequence.
// Thread-compatible (one stream per object).
class StreamDecoder {
 public:
  // `context`: the ids before the stream (the prompt); its last few tokens
  // start the window, so a first token's leading space decodes as it does
  // after that text.
  StreamDecoder(const Tokenizer* tokenizer, bool skip_special,
                const std::vector<int>& context = {});
  std::string Add(int id);
  // The text held back, at the end of the stream.
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<int> ids_;
  size_t prefix_ = 0;  // window start
  size_t read_ = 0;    // ids whose text has been returned
};

// The text each token adds after the tokens before it, for log-probability
// entries: the chosen token's (Next, which extends the context) and an
// alternative's at the same position (Peek). Special tokens keep their text.
// A token that is part of a character gives U+FFFD.
class TokenTexts {
 public:
  TokenTexts(const Tokenizer* tokenizer, const std::vector<int32_t>& context);
  std::string Next(int32_t id);
  std::string Peek(int32_t id);

 private:
  const Tokenizer* tokenizer_;
  std::vector<int> window_;  // the last few tokens
  std::string base_;         // their text
  bool base_ready_ = false;
};

}  // namespace failsafe
