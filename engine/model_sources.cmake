# The model/training side of the engine (tensors, layers, optimizers, data, checkpoints, training).
# Included by engine/CMakeLists.txt; compiled into meshlearn_engine and engine_model_test.
set(ENGINE_MODEL_SOURCES
  ${CMAKE_CURRENT_SOURCE_DIR}/src/tensor.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/init.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/model.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/optim.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/data.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/corpus.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/hf_gpt2.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/generate.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/safetensors.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/checkpoint.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/train.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/op_trace.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/tile.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/tile_rule.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/step_replay.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/pipeline.cc
)
set(ENGINE_MODEL_TESTS
  ${CMAKE_CURRENT_SOURCE_DIR}/src/init_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/model_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/optim_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/data_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/corpus_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/hf_gpt2_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/code_gpt_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/safetensors_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/train_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/op_trace_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/tile_rule_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/tile_rule_conv_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/step_replay_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/pipeline_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/src/stage_tile_test.cc
)

# Tests that take more than ~20 s in a release build get the label "slow" (ctest -L slow / -LE
# slow); the ones over a minute get "long" instead: scripts/test.sh runs them only with
# MESHLEARN_SLOW_TESTS=1 (the default run keeps the MLP target as the short quality check).
# engine/CMakeLists.txt passes both lists to meshlearn_test (cmake/meshlearn.cmake).
set(ENGINE_MODEL_SLOW_TESTS
  TrainQualityTest.FashionMlpReachesTarget
  TrainQualityTest.TinyGptLossFallsBelowUniform
  TorchCheckTest.PyTorchPredictsTheSame
  HfGpt2CheckTest.PyTorchReproducesTheLossAndLogits
  TrainQualityTest.TinyGptRecipeTrainsToPyTorchsLoss
  DeterminismTest.CodeGptStateHashSameForAllThreadsAndSimd
  DeterminismTest.CodeGpt10mStateHashSameForAllThreadsAndSimd
  PipelineTest.ExampleGptsAtTheirRealWidths
  TileRuleTest.GptLinearTilesRecomputeOnThe10mShape
)
set(ENGINE_MODEL_LONG_TESTS
  TrainQualityTest.FashionCnnReachesTarget
  TrainQualityTest.CodeGpt*
)
