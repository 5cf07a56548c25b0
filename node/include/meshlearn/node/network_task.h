// The node's names for the task model. The [network] table, its parser and the facts every party
// derives from it are protocol's (protocol/task_model.h), so that the ledger's referee parses and
// derives exactly what the node does; the node uses them under the same names.
#pragma once

#include "meshlearn/protocol/task_model.h"

namespace meshlearn::node {

using protocol::NetworkSpec;
using protocol::TaskFacts;
using protocol::UnitWork;

}  // namespace meshlearn::node
