// The dashboard: one web page that `meshlearn chain serve` (and `chain follow --listen`) answers
// at GET / of its RPC address, so `meshlearn devnet` shows it too (it runs `chain serve`).
//
// The page is self-contained: HTML, CSS, JavaScript and its charts (inline SVG drawn by the
// page's own script) are compiled into the binary; it loads nothing else, from no CDN and no
// file. Every number on it is an answer of this ledger's JSON-RPC, fetched by the browser with
// POST / — chain_status, list_nodes, list_tasks, get_task (with units), get_account,
// account_history, get_block — the calls `meshlearn task status --json` and `meshlearn wallet`
// make; the page sums and counts those records but keeps no books of its own. It updates as
// blocks arrive by long-polling wait_block, without reloading (docs/operators.md, "Dashboard").
//
// Why inline SVG and not libjs-chart.js: the charts are a few lines per round, and a page that
// needs no file outside the binary works wherever the binary does (a follower on another
// machine, a container without /usr/share/javascript).
//
// The task view links two downloads, answered by the same server (ServeTaskFile):
//   GET /tasks/<task id>/model       the task's final global state blob (protocol/state_blob.h:
//                                    the trained weights and the outer momentum), fetched from
//                                    the nodes that hold it and served only if its blob id is the
//                                    one the ledger recorded (final_state). `chain serve` keeps no
//                                    blobs; `meshlearn task fetch` turns the same blob into a
//                                    model.safetensors.
//   GET /tasks/<task id>/audit.json  the audit record: the ledger's record of the task (get_task
//                                    with its units: every hash from the initial state to the
//                                    final one, every unit's commitment, check and pay), read at a
//                                    height of the chain it names.
// Bad input gets an HTTP error with a line of text that says what is wrong: 400 (not a task id,
// or no such file), 404 (no such task), 409 (no final model: the task is open or was cancelled),
// 502 (a node served other bytes), 503 (no node serves the blob now).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/blob.h"
#include "meshlearn/base/bytes.h"
#include "meshlearn/base/status.h"

namespace meshlearn::ledger {

class RpcService;

// The page (text/html; UTF-8). Static: the same bytes for every request.
std::string_view DashboardHtml();

// A file the page links to, or the error that stands for it, as the HTTP server answers it.
struct DashboardFile {
  int http_status = 200;
  std::string content_type;
  std::string filename;  // Content-Disposition: attachment; empty for an error
  std::string body;      // the file, or the error's text (one line)
};

// A blob as a fetch delivered it: its bytes and the chunk size its manifest declared (a blob id
// depends on both, base/blob.h).
struct FetchedBlob {
  Bytes data;
  uint32_t chunk_size = kDefaultChunkSize;
};

// Where the downloads read from: the ledger's JSON-RPC (the page's own calls) and the nodes.
struct DashboardSources {
  // One call: its result, or the error as a Status whose code is the answer's data.status.
  std::function<Result<nlohmann::json>(const std::string& method, const nlohmann::json& params)>
      rpc;
  // `id` from the nodes at `endpoints` ("host:port", in order of preference); refuses a blob
  // larger than `max_bytes`.
  std::function<Result<FetchedBlob>(const BlobId& id, const std::vector<std::string>& endpoints,
                                    uint64_t max_bytes)>
      fetch;
};

// rpc: `service` in process (HandleRpc); fetch: the nodes' blob servers over HTTP (net::Fetcher,
// which checks the manifest against the id and every chunk against the manifest), into memory.
// `service` must outlive what is returned.
DashboardSources DashboardSourcesOf(RpcService* service);

// Answers GET `path` (/tasks/<id>/model or /tasks/<id>/audit.json; see above). Thread-safe if
// `sources` is. Whatever `fetch` returns, the model is served only if its blob id is the ledger's.
DashboardFile ServeTaskFile(std::string_view path, const DashboardSources& sources);

}  // namespace meshlearn::ledger
