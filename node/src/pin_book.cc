#include "meshlearn/node/pin_book.h"

#include <nlohmann/json.hpp>

namespace meshlearn::node {

using nlohmann::json;

namespace {

std::string UnitKeyString(const PinBook::UnitKey& k) {
  return k.first.ToHex() + "-" + std::to_string(k.second);
}

}  // namespace

bool PinBook::ParseTaskReason(const std::string& reason, std::string* kind, Hash256* task) {
  size_t colon = reason.find(':');
  if (colon == std::string::npos || reason.size() < colon + 1 + 64) return false;
  Result<Hash256> t = Hash256::FromHex(std::string_view(reason).substr(colon + 1, 64));
  if (!t.ok()) return false;
  if (reason.size() > colon + 65 && reason[colon + 65] != ':') return false;
  *kind = reason.substr(0, colon);
  *task = *t;
  return true;
}

Result<std::unique_ptr<PinBook>> PinBook::Open(Env* env, std::string path, net::BlobStore* store) {
  std::unique_ptr<PinBook> book(new PinBook(env, std::move(path), store));
  ML_RETURN_IF_ERROR(book->Load());
  ML_RETURN_IF_ERROR(book->Reconcile());
  return book;
}

Status PinBook::Load() {
  if (!env_->FileExists(path_)) return Status::Ok();
  ML_ASSIGN_OR_RETURN(std::string text, env_->ReadFile(path_));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return DataLoss(path_ + ": " + what +
                    " (the file is written atomically, so this is not a "
                    "crash; move it away to start with an empty book: every unreferenced blob "
                    "then becomes evictable)");
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (j.value("version", 0) != 1) return bad("unknown version");
  const json blobs = j.value("blobs", json::object());
  const json units = j.value("units", json::object());
  const json closed = j.value("closed", json::object());
  if (!blobs.is_object() || !units.is_object() || !closed.is_object()) return bad("bad layout");
  for (const auto& [hex, reasons] : blobs.items()) {
    Result<Hash256> id = Hash256::FromHex(hex);
    if (!id.ok() || !reasons.is_array()) return bad("bad blob entry " + hex);
    for (const json& r : reasons) {
      if (!r.is_string()) return bad("bad reason for blob " + hex);
      reasons_[*id].insert(r.get<std::string>());
    }
  }
  for (const auto& [key, round] : units.items()) {
    size_t dash = key.find('-');
    Result<Hash256> t = Hash256::FromHex(key.substr(0, dash));
    if (dash == std::string::npos || !t.ok() || !round.is_number_unsigned())
      return bad("bad unit " + key);
    units_[{*t, static_cast<uint32_t>(std::stoul(key.substr(dash + 1)))}] = round.get<uint32_t>();
  }
  for (const auto& [hex, h] : closed.items()) {
    Result<Hash256> t = Hash256::FromHex(hex);
    if (!t.ok() || !h.is_number_unsigned()) return bad("bad closed entry " + hex);
    closed_[*t] = h.get<uint64_t>();
  }
  return Status::Ok();
}

Status PinBook::SaveLocked() {
  json blobs = json::object();
  for (const auto& [id, reasons] : reasons_) {
    json r = json::array();
    for (const std::string& s : reasons) r.push_back(s);
    blobs[id.ToHex()] = std::move(r);
  }
  json units = json::object();
  for (const auto& [k, round] : units_) units[UnitKeyString(k)] = round;
  json closed = json::object();
  for (const auto& [t, h] : closed_) closed[t.ToHex()] = h;
  json j = {{"version", 1},
            {"blobs", std::move(blobs)},
            {"units", std::move(units)},
            {"closed", std::move(closed)}};
  return env_->WriteFileAtomic(path_, j.dump(1));
}

Status PinBook::PinLocked(const Hash256& id) {
  net::BlobId bid{id};
  if (!store_->HasManifest(bid) || store_->IsPinned(bid)) return Status::Ok();
  return store_->Pin(bid);
}

Status PinBook::UnpinLocked(const Hash256& id) {
  net::BlobId bid{id};
  while (store_->IsPinned(bid)) ML_RETURN_IF_ERROR(store_->Unpin(bid));
  return Status::Ok();
}

Status PinBook::Add(const Hash256& id, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reasons_[id].insert(reason).second) ML_RETURN_IF_ERROR(SaveLocked());
  return PinLocked(id);
}

Result<size_t> PinBook::Remove(
    const std::function<bool(const Hash256& id, const std::string& reason)>& drop) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Hash256> freed;
  bool changed = false;
  for (auto it = reasons_.begin(); it != reasons_.end();) {
    for (auto r = it->second.begin(); r != it->second.end();) {
      if (drop(it->first, *r)) {
        r = it->second.erase(r);
        changed = true;
      } else {
        ++r;
      }
    }
    if (it->second.empty()) {
      freed.push_back(it->first);
      it = reasons_.erase(it);
    } else {
      ++it;
    }
  }
  if (changed) ML_RETURN_IF_ERROR(SaveLocked());  // first the book, then the store (see header)
  for (const Hash256& id : freed) ML_RETURN_IF_ERROR(UnpinLocked(id));
  return freed.size();
}

std::set<std::string> PinBook::Reasons(const Hash256& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reasons_.find(id);
  return it == reasons_.end() ? std::set<std::string>{} : it->second;
}

std::map<Hash256, std::set<std::string>> PinBook::Snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  return reasons_;
}

Status PinBook::AddUnit(const Hash256& task, uint32_t index, uint32_t round) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = units_.emplace(UnitKey{task, index}, round);
  if (!inserted && it->second == round) return Status::Ok();
  it->second = round;
  return SaveLocked();
}

Status PinBook::RemoveUnits(const std::vector<UnitKey>& units) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const UnitKey& k : units) n += units_.erase(k);
  return n > 0 ? SaveLocked() : Status::Ok();
}

std::map<PinBook::UnitKey, uint32_t> PinBook::Units() {
  std::lock_guard<std::mutex> lock(mu_);
  return units_;
}

uint64_t PinBook::ClosedSeen(const Hash256& task) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = closed_.find(task);
  return it == closed_.end() ? 0 : it->second;
}

Status PinBook::SetClosedSeen(const Hash256& task, uint64_t height) {
  std::lock_guard<std::mutex> lock(mu_);
  closed_[task] = height;
  return SaveLocked();
}

Status PinBook::ForgetTask(const Hash256& task) {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_.erase(task) > 0 ? SaveLocked() : Status::Ok();
}

std::set<Hash256> PinBook::Tasks(const std::set<std::string>& exclude_kinds) {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<Hash256> out;
  for (const auto& [id, reasons] : reasons_) {
    for (const std::string& r : reasons) {
      std::string kind;
      Hash256 t;
      if (ParseTaskReason(r, &kind, &t) && !exclude_kinds.count(kind)) out.insert(t);
    }
  }
  for (const auto& [k, round] : units_) out.insert(k.first);
  for (const auto& [t, h] : closed_) out.insert(t);
  return out;
}

Status PinBook::Reconcile() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const net::BlobId& id : store_->ListBlobs()) {
    if (reasons_.count(id.hash)) {
      ML_RETURN_IF_ERROR(PinLocked(id.hash));
    } else {
      ML_RETURN_IF_ERROR(UnpinLocked(id.hash));
    }
  }
  return Status::Ok();
}

}  // namespace meshlearn::node
