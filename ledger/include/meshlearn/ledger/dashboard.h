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
#pragma once

#include <string_view>

namespace meshlearn::ledger {

// The page (text/html; UTF-8). Static: the same bytes for every request.
std::string_view DashboardHtml();

}  // namespace meshlearn::ledger
