#include "worker/backup_writer.h"

namespace failsafe {

BackupWriter::BackupWriter(void* base, const BackupLayout& layout, int device,
                           DeviceProgressSlot* progress, DeviceMemory* memory)
    : base_(base),
      layout_(layout),
      device_(device),
      progress_(progress),
      memory_(memory),
      thread_([this] { Run(); }) {}

BackupWriter::~BackupWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BackupWriter::SetUploader(std::function<void(const BackupJob&)> uploader) {
  uploader_ = std::move(uploader);
}

void BackupWriter::Enqueue(BackupJob job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void BackupWriter::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void BackupWriter::Run() {
  const int64_t row = static_cast<int64_t>(layout_.header().head_dim) * layout_.elem_bytes();
  const int bs = layout_.header().block_size;
  while (true) {
    BackupJob job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    copies_.clear();
    for (const auto& c : job.copies) {
      const size_t n = static_cast<size_t>((c.to - c.from) * row);  // bytes of K, and of V
      DeviceMemory::AppendCopy(copies_, {c.dst + c.from * row, c.page + c.from * row, n});
      DeviceMemory::AppendCopy(copies_,
                               {c.dst + (bs + c.from) * row, c.page + (bs + c.from) * row, n});
      bytes_copied_ += static_cast<int64_t>(2 * n);
    }
    memory_->BackgroundCopiesToHost(copies_.data(), copies_.size());
    // Publish only after the copies: a reader that sees `tokens` sees the data.
    BackupProgress* p = layout_.Progress(base_, job.slot, device_);
    if (p->seq_id.load(std::memory_order_relaxed) != job.seq_id) {
      p->tokens.store(0, std::memory_order_relaxed);
      p->seq_id.store(job.seq_id, std::memory_order_relaxed);
    }
    if (job.end > p->tokens.load(std::memory_order_relaxed) &&
        job.start <= p->tokens.load(std::memory_order_relaxed)) {
      p->tokens.store(job.end, std::memory_order_release);
    }
    if (uploader_) uploader_(job);
    DeviceProgressRegion::Moved(progress_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }
}

}  // namespace failsafe
