#include "router/router.h"

#include <fmt/format.h>

#include <boost/asio.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <utility>

#include "common/clock.h"
#include "common/log.h"
#include "common/sse.h"
#include "router/chunk_edit.h"
#include "server/api_error.h"
#include "server/http_exchange.h"

namespace failsafe {

namespace asio = boost::asio;
using ojson = nlohmann::ordered_json;

const char* ResumeCauseName(ResumeCause c) {
  switch (c) {
    case ResumeCause::kRefused:
      return "refused";
    case ResumeCause::kReset:
      return "reset";
    case ResumeCause::kServerError:
      return "server_error";
    case ResumeCause::kStreamError:
      return "stream_error";
    case ResumeCause::kStall:
      return "stall";
    case ResumeCause::kNodeDown:
      return "node_down";
    case ResumeCause::kBusy:
      return "busy";
    case ResumeCause::kCount:
      break;
  }
  return "?";
}

namespace {

// What every proxied request shares.
struct Shared {
  RouterOptions options;
  // The front end's event loop: a request's client side and its node side
  // run on the same threads, so a chunk crosses no thread.
  asio::io_context* io = nullptr;
  std::unique_ptr<NodePool> pool;
  RouterCounters counters;
};

std::string SseFrame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 8);
  out += "data: ";
  out += data;
  out += "\n\n";
  return out;
}

// A member that is `true` (a value of another type is the node's to refuse).
template <typename Json>
bool IsTrue(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->template get<bool>();
}

// A member that is the empty string.
template <typename Json>
bool EmptyString(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() && it->template get_ref<const std::string&>().empty();
}

// A choice of a chunk whose role already went out: takes the role out and
// says whether anything is left to send (text, a tool call, a finish,
// log-probabilities, token ids).
template <typename Json>
bool DropRepeatedRole(Json& c) {
  if (!c.contains("delta") || !c["delta"].is_object()) return true;
  Json& d = c["delta"];
  d.erase("role");
  const bool text = !d.empty() && !(d.size() == 1 && EmptyString(d, "content"));
  const auto set = [&](const char* k) { return c.contains(k) && !c[k].is_null(); };
  const bool ids = c.contains("token_ids") && c["token_ids"].is_array() && !c["token_ids"].empty();
  return text || set("finish_reason") || set("logprobs") || ids;
}

// One client request and its attempts on nodes, on a strand of its own.
class Proxy : public std::enable_shared_from_this<Proxy> {
 public:
  Proxy(std::shared_ptr<Shared> shared, std::shared_ptr<HttpExchange> ex)
      : s_(std::move(shared)),
        ex_(std::move(ex)),
        strand_(asio::make_strand(*s_->io)),
        timer_(strand_) {}

  void Start() {
    ++s_->counters.requests;
    ++s_->counters.in_flight;
    const HttpRequest& r = ex_->request();
    method_ = r.method;
    target_ = r.path + (r.query.empty() ? "" : "?" + r.query);
    completion_ =
        r.method == "POST" && (r.path == "/v1/completions" || r.path == "/v1/chat/completions");
    ex_->OnAbort([weak = weak_from_this()](AbortCause) {
      if (auto self = weak.lock()) asio::post(self->strand_, [self] { self->ClientGone(); });
    });
    asio::post(strand_, [self = shared_from_this()] { self->Prepare(); });
  }

 private:
  // The request as the nodes get it, and what the router needs of it.
  void Prepare() {
    body_text_ = ex_->request().body;
    if (completion_) {
      ojson j = ojson::parse(body_text_, nullptr, /*allow_exceptions=*/false);
      // A body the nodes will refuse goes to one of them as it is: its answer
      // (400) is the client's.
      if (j.is_object()) {
        body_ = std::move(j);
        stream_ = IsTrue(body_, "stream");
        const auto count = [&](const char* k) {
          return body_.contains(k) && body_[k].is_number_integer() ? body_[k].get<int64_t>() : 1;
        };
        const bool many = count("n") > 1 || count("best_of") > 1 ||
                          (body_.contains("prompt") && body_["prompt"].is_array() &&
                           !body_["prompt"].empty() && !body_["prompt"][0].is_number_integer());
        const bool echo = IsTrue(body_, "echo");
        resumable_ = stream_ && !many && !echo;
        multi_ = stream_ && many && !echo;
        client_ids_ = IsTrue(body_, "return_token_ids");
        if (body_.contains("resume_token_ids") && body_["resume_token_ids"].is_array()) {
          for (const auto& t : body_["resume_token_ids"])
            if (t.is_number_integer()) base_resume_.push_back(t.get<int32_t>());
        }
        if (stream_) body_["return_token_ids"] = true;
        // A sampled stream gets a seed, so that a resumed draw is the same draw.
        if ((resumable_ || multi_) && (!body_.contains("seed") || body_["seed"].is_null())) {
          static thread_local std::mt19937_64 rng(std::random_device{}());
          body_["seed"] = static_cast<int64_t>(rng() >> 1);
        }
        // Prefix affinity: the start of the prompt (or of the conversation).
        std::string key;
        if (body_.contains("prompt") && body_["prompt"].is_string()) {
          key = body_["prompt"].get<std::string>();
        } else if (body_.contains("messages")) {
          key = body_["messages"].dump();
        }
        if (key.size() > 256) key.resize(256);
        affinity_ = AffinityKey(key);
      }
    }
    Attempt();
  }

  void Attempt() {
    if (over_) return;
    if (tries_ >= s_->options.max_attempts) {
      return GiveUp(fmt::format("no node could serve the request ({} tried; the last: {})", tries_,
                                last_error_));
    }
    const int node = s_->pool->Acquire(affinity_, excluded_);
    if (node < 0) {
      return GiveUp(tries_ == 0
                        ? "no node is available"
                        : fmt::format("no other node is available (the last: {})", last_error_));
    }
    ++tries_;
    ++gen_;
    node_ = node;
    ticket_ = s_->pool->Watch(node, [weak = weak_from_this(), gen = gen_] {
      if (auto self = weak.lock()) {
        asio::post(self->strand_, [self, gen] {
          if (gen == self->gen_)
            self->Failover(ResumeCause::kNodeDown, "stopped answering its health checks");
        });
      }
    });
    if (ticket_ == 0) {  // went down just now
      s_->pool->Release(node);
      node_ = -1;
      excluded_.push_back(node);
      --tries_;
      return Attempt();
    }
    UpstreamRequest req;
    req.method = method_;
    req.target = target_;
    req.host_header = s_->pool->address(node);
    req.connect_timeout_ms = s_->options.pool.connect_timeout_ms;
    if (!stream_) req.total_timeout_ms = s_->options.request_timeout_ms;
    held_back_.reset();
    if (!body_.is_null()) {
      if (resumable_ && !sent_ids_.empty()) {
        // The ids sent but the last: the node produces the last one again,
        // which is checked and not sent twice.
        std::vector<int32_t> resume = base_resume_;
        resume.insert(resume.end(), sent_ids_.begin(), sent_ids_.end() - 1);
        held_back_ = sent_ids_.back();
        ojson b = body_;
        b["resume_token_ids"] = resume;
        req.body = b.dump();
      } else {
        req.body = body_.dump();
      }
    } else {
      req.body = body_text_;
    }
    // Several choices go again from the start: each one's tokens already
    // sent are produced again, checked and dropped.
    for (auto& [index, cs] : choices_) {
      cs.replayed = 0;
      cs.replay_to = cs.ids.size();
    }
    status_ = 0;
    sse_.clear();
    answer_.clear();
    last_token_ns_ = 0;
    UpstreamHandlers h;
    const uint64_t gen = gen_;
    h.on_head = [this, gen](int status, std::string content_type) {
      if (gen == gen_) OnHead(status, std::move(content_type));
    };
    h.on_data = [this, gen](std::string_view data) {
      if (gen == gen_) OnData(data);
    };
    h.on_end = [self = shared_from_this(), gen](bool complete, bool connected, std::string error) {
      if (gen == self->gen_) self->OnEnd(complete, connected, std::move(error));
    };
    call_ = std::make_shared<UpstreamCall>(strand_, s_->pool->endpoint(node), std::move(req),
                                           std::move(h));
    call_->Start();
    if (stream_) Arm(s_->options.first_token_timeout_ms);
  }

  void OnHead(int status, std::string content_type) {
    status_ = status;
    content_type_ = std::move(content_type);
    if (status == 200 && stream_ && !client_started_) {
      client_started_ = true;
      ex_->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    }
  }

  void OnData(std::string_view data) {
    if (status_ == 200 && stream_) {
      sse_.append(data);
      for (std::string& event : TakeSseData(&sse_)) {
        if (over_ || !OnEvent(std::move(event))) return;
      }
    } else {
      answer_.append(data);
    }
  }

  // One event of a stream; false when the attempt is over.
  bool OnEvent(std::string event) {
    if (event == "[DONE]") {
      ex_->Write(SseFrame(event));
      ex_->EndStream();
      ++s_->counters.completed;
      Finish();
      return false;
    }
    if (event.rfind("{\"error\"", 0) == 0) {
      Failover(ResumeCause::kStreamError, "error event: " + event.substr(0, 200));
      return false;
    }
    if (multi_) {
      try {
        return OnChoicesEvent(std::move(event));
      } catch (const std::exception& e) {  // a chunk of a shape no node sends
        Failover(ResumeCause::kStreamError, std::string("a malformed chunk: ") + e.what());
        return false;
      }
    }
    ids_.clear();
    const std::optional<int> n = AppendChunkTokenIds(event, &ids_);
    if (!n) {
      Failover(ResumeCause::kStreamError, "a chunk with malformed token ids");
      return false;
    }
    if (*n > 0) ObserveToken();
    if (held_back_ && *n > 0) {
      // The token held back: produced again, alone in its chunk, the same,
      // and not sent twice.
      const bool same = ids_.size() == 1 && ids_[0] == *held_back_;
      held_back_.reset();
      if (same) return true;
      GiveUp("the resumed stream does not go on with the tokens already sent");
      return false;
    }
    sent_ids_.insert(sent_ids_.end(), ids_.begin(), ids_.end());
    // A resumed stream's opening chunk (the assistant's role) went out already.
    if (sent_any_ && *n == 0 && event.find("\"role\"") != std::string::npos) {
      ojson j = ojson::parse(event, nullptr, false);
      if (j.is_object() && j.contains("choices") && j["choices"].is_array()) {
        bool keep = false;
        for (auto& c : j["choices"]) keep |= DropRepeatedRole(c);
        if (!keep) return true;
        event = j.dump();
      }
    }
    if (!client_ids_) {
      // A token whose text is held back (a character cut between tokens)
      // makes a chunk only because the router asked for ids: the client,
      // who did not, gets none.
      if (*n > 0 && event.find("\"finish_reason\":null") != std::string::npos &&
          event.find("\"logprobs\":{") == std::string::npos &&
          (event.find("\"text\":\"\"") != std::string::npos ||
           event.find("\"delta\":{\"content\":\"\"}") != std::string::npos)) {
        return true;
      }
      StripTokenIds(&event);
    }
    return Forward(std::move(event));
  }

  // One chunk of a stream of several choices (parsed: such streams are
  // rare). A replayed choice's chunks are dropped until it has produced again
  // every token it sent, each checked; its role and finish go out once.
  bool OnChoicesEvent(std::string event) {
    nlohmann::json j = nlohmann::json::parse(event, nullptr, false);
    if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array() ||
        j["choices"].empty()) {
      return Forward(std::move(event));  // usage, or what the router does not know
    }
    nlohmann::json kept = nlohmann::json::array();
    for (nlohmann::json& c : j["choices"]) {
      const int64_t index =
          c.contains("index") && c["index"].is_number_integer() ? c["index"].get<int64_t>() : 0;
      ChoiceSent& cs = choices_[index];
      std::vector<int32_t> ids;
      if (c.contains("token_ids") && c["token_ids"].is_array())
        ids = c["token_ids"].get<std::vector<int32_t>>();
      if (!ids.empty()) ObserveToken();
      if (cs.replayed < cs.replay_to) {
        if (cs.replayed + ids.size() > cs.replay_to) {
          GiveUp("the replayed stream's chunk cannot be split at the tokens already sent");
          return false;
        }
        if (!std::equal(ids.begin(), ids.end(), cs.ids.begin() + cs.replayed)) {
          GiveUp("the replayed stream does not produce the tokens already sent");
          return false;
        }
        cs.replayed += ids.size();
        continue;  // sent already
      }
      const bool finishes = c.contains("finish_reason") && !c["finish_reason"].is_null();
      if (cs.finished) continue;  // its end went out already
      cs.ids.insert(cs.ids.end(), ids.begin(), ids.end());
      if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("role")) {
        if (cs.role && !DropRepeatedRole(c)) continue;
        cs.role = true;
      }
      if (finishes) cs.finished = true;
      if (!client_ids_) {
        const bool no_text = EmptyString(c, "text") ||
                             (c.contains("delta") && c["delta"].is_object() &&
                              c["delta"].size() == 1 && EmptyString(c["delta"], "content"));
        if (!ids.empty() && no_text && !finishes &&
            (!c.contains("logprobs") || c["logprobs"].is_null())) {
          continue;  // a chunk only for its ids
        }
        c.erase("token_ids");
      }
      kept.push_back(std::move(c));
    }
    if (kept.empty()) return true;
    j["choices"] = std::move(kept);
    return Forward(j.dump());
  }

  // A token came: the node's measured gap, and the stall deadline moves.
  void ObserveToken() {
    const int64_t now = MonotonicNanos();
    const double gap = last_token_ns_ > 0
                           ? s_->pool->ObserveGap(node_, (now - last_token_ns_) * 1e-9)
                           : s_->pool->TokenGap(node_);
    last_token_ns_ = now;
    Arm(std::max<int64_t>(s_->options.stall_floor_ms,
                          static_cast<int64_t>(s_->options.stall_factor * gap * 1000)));
  }

  // Sends a chunk on, under the response's first id.
  bool Forward(std::string event) {
    if (response_id_.empty()) {
      if (auto id = TopLevelString(event, "id")) response_id_ = *id;
    } else {
      ReplaceTopLevelString(&event, "id", response_id_);
    }
    sent_any_ = true;
    ex_->Write(SseFrame(event));
    return true;
  }

  void OnEnd(bool complete, bool connected, std::string error) {
    call_.reset();
    if (over_) return;
    if (!complete) {
      if (stream_ && status_ == 200) {
        return Failover(ResumeCause::kReset, "the stream ended before [DONE]: " + error);
      }
      return Failover(connected ? ResumeCause::kReset : ResumeCause::kRefused, error);
    }
    if (status_ == 429) return Failover(ResumeCause::kBusy, "the node's queue is full");
    if (status_ >= 500) {
      return Failover(ResumeCause::kServerError,
                      fmt::format("HTTP {}: {}", status_, answer_.substr(0, 200)));
    }
    if (stream_ && status_ == 200) {
      return Failover(ResumeCause::kReset, "the stream ended before [DONE]");
    }
    // The node's whole answer (a 4xx is the request's fault: any node says so).
    ++s_->counters.completed;
    if (client_started_) {
      // A resumed stream refused: the client's stream ends with that error.
      ex_->Write(SseFrame(answer_.empty() ? ErrorBody(InternalError("empty answer")) : answer_));
      ex_->Write(SseFrame("[DONE]"));
      ex_->EndStream();
    } else {
      ex_->Reply(status_, std::move(answer_),
                 content_type_.empty() ? "application/json" : content_type_);
    }
    Finish();
  }

  void Failover(ResumeCause cause, std::string error) {
    if (over_) return;
    last_error_ = fmt::format("{}: {}", s_->pool->address(node_), error);
    LeaveNode();
    const bool can = !stream_ || resumable_ || multi_ || !sent_any_;
    if (!can) {
      return GiveUp("the node failed (" + last_error_ +
                    ") and a stream with echo cannot be resumed once sent");
    }
    if (cause != ResumeCause::kBusy) {
      FS_LOG_INFO("router: request leaves {} ({}): {}", s_->pool->address(excluded_.back()),
                  ResumeCauseName(cause), error);
    }
    if (tries_ < s_->options.max_attempts) ++s_->counters.resumed[static_cast<int>(cause)];
    if (cause == ResumeCause::kBusy && !answer_.empty()) busy_answer_ = answer_;
    Attempt();
  }

  void LeaveNode() {
    ++gen_;
    deadline_ns_ = 0;
    if (call_) {
      call_->Cancel();
      call_.reset();
    }
    if (node_ >= 0) {
      s_->pool->Unwatch(node_, ticket_);
      s_->pool->Release(node_);
      excluded_.push_back(node_);
      node_ = -1;
    }
  }

  void GiveUp(const std::string& message) {
    if (over_) return;
    LeaveNode();
    ++s_->counters.failed;
    if (client_started_) {
      ex_->Write(SseFrame(ErrorBody(ServiceUnavailable(message))));
      ex_->Write(SseFrame("[DONE]"));
      ex_->EndStream();
    } else if (!busy_answer_.empty()) {
      ex_->Reply(429, busy_answer_);  // every node was full
    } else {
      ex_->Reply(503, ErrorBody(ServiceUnavailable(message)));
    }
    Finish();
  }

  void ClientGone() {
    if (over_) return;
    LeaveNode();
    Finish();
  }

  void Finish() {
    if (over_) return;
    LeaveNode();
    over_ = true;
    timer_.cancel();
    --s_->counters.in_flight;
  }

  // The stall deadline: `ms` from now. Pushed later on every token without
  // touching the timer; the timer, when it fires early, waits for the rest.
  void Arm(int64_t ms) {
    if (ms <= 0) return;
    const int64_t deadline = MonotonicNanos() + ms * 1000000;
    const bool sooner = deadline_ns_ == 0 || deadline < deadline_ns_;
    deadline_ns_ = deadline;
    stall_ms_ = ms;
    if (!waiting_) {
      Wait();
    } else if (sooner) {
      timer_.cancel();  // its handler waits again, for the new deadline
    }
  }

  void Wait() {
    waiting_ = true;
    timer_.expires_after(
        std::chrono::nanoseconds(std::max<int64_t>(0, deadline_ns_ - MonotonicNanos())));
    timer_.async_wait([self = shared_from_this()](boost::system::error_code) {
      self->waiting_ = false;
      if (self->over_ || self->deadline_ns_ == 0) return;
      if (self->deadline_ns_ > MonotonicNanos()) return self->Wait();
      self->deadline_ns_ = 0;
      self->Failover(ResumeCause::kStall, fmt::format("no token within {} ms", self->stall_ms_));
    });
  }

  const std::shared_ptr<Shared> s_;
  const std::shared_ptr<HttpExchange> ex_;
  RouterStrand strand_;
  asio::steady_timer timer_;
  std::string method_, target_;
  bool completion_ = false;

  std::string body_text_;
  ojson body_;  // null: passed through as body_text_
  bool stream_ = false, resumable_ = false, client_ids_ = false;
  // A stream of several choices (n, a list of prompts): what each choice
  // (by index) has sent, and while a new node replays the request, how many
  // of each one's tokens it has produced again.
  struct ChoiceSent {
    std::vector<int32_t> ids;
    bool role = false, finished = false;
    // While a new node replays: of the first replay_to ids (those sent when
    // the last node failed), how many it has produced again.
    size_t replayed = 0, replay_to = 0;
  };
  bool multi_ = false;
  std::map<int64_t, ChoiceSent> choices_;
  std::vector<int32_t> base_resume_;
  uint64_t affinity_ = 0;

  int tries_ = 0;
  uint64_t gen_ = 0;  // attempt generation: callbacks of a left attempt do nothing
  int node_ = -1;
  uint64_t ticket_ = 0;
  std::vector<int> excluded_;
  std::shared_ptr<UpstreamCall> call_;
  int status_ = 0;
  std::string content_type_, answer_, busy_answer_, sse_, last_error_ = "none";
  int64_t last_token_ns_ = 0;
  int64_t deadline_ns_ = 0;  // of the stall timer; 0: none
  int64_t stall_ms_ = 0;
  bool waiting_ = false;  // the timer's wait is pending

  bool client_started_ = false, sent_any_ = false, over_ = false;
  std::vector<int32_t> sent_ids_, ids_;
  // A resumed one-choice stream: the last token sent, which the new node
  // produces again (checked, not sent twice).
  std::optional<int32_t> held_back_;
  std::string response_id_;  // a JSON string literal
};

}  // namespace

struct FleetRouter::Impl {
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  std::unique_ptr<HttpServer> server;
  bool started = false, stopped = false;

  std::string Metrics() const;
};

FleetRouter::FleetRouter(const RouterOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->shared->options = options;
}

FleetRouter::~FleetRouter() { Stop(); }

std::string FleetRouter::Impl::Metrics() const {
  const RouterCounters& c = shared->counters;
  std::string out;
  auto counter = [&](const char* name, const char* help, int64_t v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  counter("failsafe_router_requests_total", "Requests taken.", c.requests);
  counter("failsafe_router_requests_completed_total", "Requests a node answered.", c.completed);
  counter("failsafe_router_requests_failed_total",
          "Requests the router ended with an error (no node could serve them).", c.failed);
  gauge("failsafe_router_requests_in_flight", "Requests being proxied.", c.in_flight);
  out +=
      "# HELP failsafe_router_requests_resumed_total Times a request left a node for another, "
      "by cause.\n# TYPE failsafe_router_requests_resumed_total counter\n";
  for (int i = 0; i < static_cast<int>(ResumeCause::kCount); ++i) {
    out += fmt::format("failsafe_router_requests_resumed_total{{cause=\"{}\"}} {}\n",
                       ResumeCauseName(static_cast<ResumeCause>(i)), c.resumed[i].load());
  }
  const std::vector<NodeSnapshot> nodes = shared->pool->Snapshot();
  int up = 0;
  for (const NodeSnapshot& n : nodes) up += n.state == NodeState::kUp;
  gauge("failsafe_router_nodes", "Nodes configured.", static_cast<double>(nodes.size()));
  gauge("failsafe_router_nodes_healthy", "Nodes up (answering /health with 200).", up);
  out +=
      "# HELP failsafe_router_node_up Whether a node is up.\n# TYPE failsafe_router_node_up "
      "gauge\n";
  for (const NodeSnapshot& n : nodes)
    out += fmt::format("failsafe_router_node_up{{node=\"{}\"}} {}\n", n.address,
                       n.state == NodeState::kUp ? 1 : 0);
  out +=
      "# HELP failsafe_router_node_in_flight The router's requests on a node.\n"
      "# TYPE failsafe_router_node_in_flight gauge\n";
  for (const NodeSnapshot& n : nodes)
    out +=
        fmt::format("failsafe_router_node_in_flight{{node=\"{}\"}} {}\n", n.address, n.in_flight);
  out +=
      "# HELP failsafe_router_node_token_gap_seconds A node's measured time between tokens.\n"
      "# TYPE failsafe_router_node_token_gap_seconds gauge\n";
  for (const NodeSnapshot& n : nodes)
    out += fmt::format("failsafe_router_node_token_gap_seconds{{node=\"{}\"}} {}\n", n.address,
                       n.token_gap_s);
  out +=
      "# HELP failsafe_router_node_downs_total Times a node went down.\n"
      "# TYPE failsafe_router_node_downs_total counter\n";
  for (const NodeSnapshot& n : nodes)
    out += fmt::format("failsafe_router_node_downs_total{{node=\"{}\"}} {}\n", n.address, n.downs);
  return out;
}

Status FleetRouter::Start() {
  Impl& m = *impl_;
  if (m.started) return FailedPrecondition("the router was started already");
  const RouterOptions& o = m.shared->options;
  if (o.nodes.empty()) return InvalidArgument("the router needs at least one --node");
  if (o.max_attempts < 1) return InvalidArgument("--max-attempts must be at least 1");
  std::vector<std::string> names;
  std::vector<asio::ip::tcp::endpoint> endpoints;
  for (const std::string& a : o.nodes) {
    std::string error;
    auto ep = ResolveNode(a, &error);
    if (!ep) return InvalidArgument("{}", error);
    std::string name = a;
    if (name.rfind("http://", 0) == 0) name.erase(0, 7);
    if (!name.empty() && name.back() == '/') name.pop_back();
    names.push_back(name);
    endpoints.push_back(*ep);
  }
  m.server = std::make_unique<HttpServer>(nullptr, nullptr, o.server);
  m.shared->io = &m.server->io_context();
  m.shared->pool = std::make_unique<NodePool>(m.shared->io, names, endpoints, o.pool);
  auto shared = m.shared;
  auto proxy = [shared](const std::shared_ptr<HttpExchange>& ex) {
    std::make_shared<Proxy>(shared, ex)->Start();
  };
  m.server->AddRoute({"POST", "/v1/completions", proxy, /*json_body=*/true});
  m.server->AddRoute({"POST", "/v1/chat/completions", proxy, /*json_body=*/true});
  m.server->AddRoute({"GET", "/v1/models", proxy});
  m.server->AddRoute({"POST", "/tokenize", proxy, true});
  m.server->AddRoute({"POST", "/detokenize", proxy, true});
  m.server->AddRoute({"GET", "/health", [shared](const std::shared_ptr<HttpExchange>& ex) {
                        const int up = shared->pool->Healthy();
                        nlohmann::json j = {{"status", up > 0 ? "ok" : "unavailable"},
                                            {"nodes_healthy", up},
                                            {"nodes", shared->pool->size()}};
                        ex->Reply(up > 0 ? 200 : 503, j.dump());
                      }});
  m.server->AddRoute({"GET", "/metrics", [this](const std::shared_ptr<HttpExchange>& ex) {
                        ex->Reply(200, impl_->Metrics(), "text/plain; version=0.0.4");
                      }});
  m.server->AddRoute({"GET", "/router/nodes", [shared](const std::shared_ptr<HttpExchange>& ex) {
                        nlohmann::json nodes = nlohmann::json::array();
                        for (const NodeSnapshot& n : shared->pool->Snapshot()) {
                          nodes.push_back({{"node", n.address},
                                           {"state", NodeStateName(n.state)},
                                           {"in_flight", n.in_flight},
                                           {"running", n.running},
                                           {"waiting", n.waiting},
                                           {"capacity", n.capacity},
                                           {"kv_usage", n.kv_usage},
                                           {"token_gap_s", n.token_gap_s},
                                           {"downs", n.downs}});
                        }
                        ex->Reply(200, nlohmann::json{{"nodes", nodes}}.dump());
                      }});
  Status st = m.server->Start();
  if (!st.ok()) return st;
  m.started = true;
  // Until the first checks, requests find no node up (503).
  m.shared->pool->Start();
  m.shared->pool->WaitForFirstChecks(o.pool.health_timeout_ms + 500);
  return Status::Ok();
}

int FleetRouter::port() const { return impl_->server ? impl_->server->port() : 0; }

int FleetRouter::Drain(int64_t timeout_ms) {
  return impl_->server ? impl_->server->Drain(timeout_ms) : 0;
}

void FleetRouter::Stop() {
  Impl& m = *impl_;
  if (m.stopped) return;
  m.stopped = true;
  // The health checks leave the event loop first, so that the server's stop
  // finds it running out of work.
  if (m.shared->pool && m.started) m.shared->pool->Stop();
  if (m.server) m.server->Stop();
}

const RouterCounters& FleetRouter::counters() const { return impl_->shared->counters; }

std::vector<NodeSnapshot> FleetRouter::Nodes() const { return impl_->shared->pool->Snapshot(); }

}  // namespace failsafe
