// Content-addressed blobs: the ids and manifests are pure functions in base/blob.h (the ledger
// computes blob ids too, and must not depend on the network layer); net/ names them as its own.
#pragma once

#include "meshlearn/base/blob.h"

namespace meshlearn::net {

using meshlearn::BlobId;
using meshlearn::BuildManifest;
using meshlearn::DecodeManifest;
using meshlearn::EncodeManifest;
using meshlearn::kDefaultChunkSize;
using meshlearn::kManifestMagic;
using meshlearn::kManifestVersion;
using meshlearn::kMaxBlobSize;
using meshlearn::kMaxChunkSize;
using meshlearn::kMaxManifestChunks;
using meshlearn::Manifest;
using meshlearn::ValidateBlobSize;
using meshlearn::ValidateManifest;
using meshlearn::VerifyChunk;

}  // namespace meshlearn::net
