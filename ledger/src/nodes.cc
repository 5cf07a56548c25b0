// Nodes: registration, updates, heartbeats, link reports and leaving.
#include <algorithm>
#include <string>
#include <vector>

#include "execute.h"

namespace meshlearn::ledger {

namespace {

Status CheckNodeFields(std::string_view what, const std::string& endpoint, uint32_t roles) {
  if (endpoint.empty()) {
    return InvalidArgument(std::string(what) + ": endpoint is empty (give \"http://host:port\")");
  }
  if (roles == 0 || (roles & ~kAllRoles) != 0) {
    return InvalidArgument(std::string(what) + ": roles must be a non-empty set of solver, " +
                           "verifier, whistleblower, aggregator (bits 0-3), got " +
                           std::to_string(roles));
  }
  return Status::Ok();
}

}  // namespace

Status ExecuteRegisterNode(ExecContext& ctx, const RegisterNodeTx& tx) {
  if (tx.node_id == PublicKey{}) return InvalidArgument("register node: node_id is the zero key");
  ML_RETURN_IF_ERROR(CheckNodeFields("register node", tx.endpoint, tx.roles));
  Amount min = ctx.params().MinStakeFor(tx.roles);
  if (tx.stake < min) {
    return FailedPrecondition("register node: stake " + std::to_string(tx.stake) +
                              " is below the minimum " + std::to_string(min) + " for roles " +
                              RolesToString(tx.roles));
  }
  if (ctx.params().verification && (tx.roles & kRoleSolver) != 0 && tx.secret_head.IsZero()) {
    return InvalidArgument("register node: secret_head is zero; a solver on a chain with "
                           "verification must register the head of its forced-error secret "
                           "chain (protocol::SecretChainElement(seed, 0))");
  }
  NodeRecord n;
  if (const NodeRecord* old = ctx.state.nodes.Find(tx.node_id)) {
    // A node that left may come back under the same owner; its reputation stays.
    if (old->owner != ctx.tx.sender || old->status != NodeStatus::kUnbonding) {
      return AlreadyExists("register node: node " + tx.node_id.ToHex() + " is already registered");
    }
    n = *old;
  } else {
    n.id = tx.node_id;
    n.owner = ctx.tx.sender;
    n.reputation.joined_height = ctx.height;
  }
  n.endpoint = tx.endpoint;
  n.roles = tx.roles;
  n.capabilities = tx.capabilities;
  n.price = tx.price;
  n.status = NodeStatus::kActive;
  n.last_heartbeat_height = ctx.height;
  // A (re-)registration starts a fresh secret chain.
  n.secret_anchor = tx.secret_head;
  n.secret_anchor_index = 0;
  n.secrets_committed = 0;
  ML_RETURN_IF_ERROR(CheckedAdd(n.stake, tx.stake, &n.stake, "node stake"));
  ML_RETURN_IF_ERROR(Debit(ctx.state, ctx.tx.sender, tx.stake, "node stake"));
  ctx.state.nodes.Put(tx.node_id, std::move(n));
  return Status::Ok();
}

Status ExecuteUpdateNode(ExecContext& ctx, const UpdateNodeTx& tx) {
  ML_RETURN_IF_ERROR(CheckNodeFields("update node", tx.endpoint, tx.roles));
  ML_ASSIGN_OR_RETURN(NodeRecord * n, OwnedNode(ctx.state, tx.node_id, ctx.tx.sender));
  if (n->status != NodeStatus::kActive) {
    return FailedPrecondition("update node: node " + tx.node_id.ShortHex() + " is " +
                              std::string(NodeStatusName(n->status)));
  }
  Amount min = ctx.params().MinStakeFor(tx.roles);
  if (n->stake < min) {
    return FailedPrecondition("update node: stake " + std::to_string(n->stake) +
                              " is below the minimum " + std::to_string(min) + " for roles " +
                              RolesToString(tx.roles) + "; stake more first");
  }
  n->endpoint = tx.endpoint;
  n->roles = tx.roles;
  n->capabilities = tx.capabilities;
  n->price = tx.price;
  return Status::Ok();
}

Status ExecuteHeartbeat(ExecContext& ctx, const HeartbeatTx& tx) {
  ML_ASSIGN_OR_RETURN(NodeRecord * n, OwnedNode(ctx.state, tx.node_id, ctx.tx.sender));
  if (n->status == NodeStatus::kUnbonding) {
    return FailedPrecondition("heartbeat: node " + tx.node_id.ShortHex() + " has left");
  }
  n->last_heartbeat_height = ctx.height;
  return Status::Ok();
}

Status ExecuteReportLinks(ExecContext& ctx, const ReportLinksTx& tx) {
  ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, tx.node_id, ctx.tx.sender, "report links"));
  if (tx.links.size() > protocol::kMaxNodeLinks) {
    return InvalidArgument("report links: " + std::to_string(tx.links.size()) + " links, at most " +
                           std::to_string(protocol::kMaxNodeLinks) +
                           ": report the peers measured last");
  }
  NodeRecord* n = ctx.state.nodes.FindMutable(tx.node_id);
  if (n->status == NodeStatus::kUnbonding) {
    return FailedPrecondition("report links: node " + tx.node_id.ShortHex() + " has left");
  }
  std::vector<NodeLink> links = tx.links;
  for (size_t i = 0; i < links.size(); ++i) {
    const NodeLink& l = links[i];
    const std::string at = "report links: links[" + std::to_string(i) + "]";
    if (l.peer == tx.node_id) {
      return InvalidArgument(at + " is to node " + l.peer.ShortHex() +
                             " itself: report only links to other nodes");
    }
    if (ctx.state.nodes.Find(l.peer) == nullptr) {
      return NotFound(at + ".peer " + l.peer.ToHex() +
                      " is not a registered node: report only peers you exchanged stage data with");
    }
    if (l.bandwidth_bytes_per_s == 0) {
      return InvalidArgument(at + ".bandwidth_bytes_per_s is 0: a measured link moved bytes; " +
                             "leave out a peer you did not measure");
    }
    if (l.bandwidth_bytes_per_s > protocol::kMaxLinkBandwidthBytesPerS) {
      return InvalidArgument(
          at + ".bandwidth_bytes_per_s " + std::to_string(l.bandwidth_bytes_per_s) + " is above " +
          std::to_string(protocol::kMaxLinkBandwidthBytesPerS) +
          " (1 TB/s, faster than any network link): check its units (bytes " + "per second)");
    }
    if (l.latency_ms > protocol::kMaxLinkLatencyMs) {
      return InvalidArgument(at + ".latency_ms " + std::to_string(l.latency_ms) + " is above " +
                             std::to_string(protocol::kMaxLinkLatencyMs) +
                             " (a minute: a broken link, not a slow one): check its units " +
                             "(milliseconds) or leave the peer out");
    }
  }
  std::sort(links.begin(), links.end(),
            [](const NodeLink& a, const NodeLink& b) { return a.peer < b.peer; });
  for (size_t i = 1; i < links.size(); ++i) {
    if (links[i].peer == links[i - 1].peer) {
      return InvalidArgument("report links: peer " + links[i].peer.ShortHex() +
                             " appears more than once: report each peer once");
    }
  }
  n->links = std::move(links);
  return Status::Ok();
}

Status ExecuteLeaveNode(ExecContext& ctx, const LeaveNodeTx& tx) {
  ML_ASSIGN_OR_RETURN(NodeRecord * n, OwnedNode(ctx.state, tx.node_id, ctx.tx.sender));
  if (n->status == NodeStatus::kUnbonding) {
    return FailedPrecondition("leave node: node " + tx.node_id.ShortHex() + " already left");
  }
  n->status = NodeStatus::kUnbonding;
  if (n->stake == 0) return Status::Ok();
  return BeginUnbonding(ctx.state, ctx.params(), ctx.height, n, n->stake);
}

}  // namespace meshlearn::ledger
