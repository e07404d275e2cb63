// The `mer` subcommands. Each takes its arguments (after the subcommand name) and returns the
// process exit status; errors are printed to stderr as "mer <command>: <message>".
#pragma once

#include <string>
#include <vector>

namespace mer::cli {

using Args = std::vector<std::string>;

int RunSynth(const Args& args);
int RunInfo(const Args& args);
int RunGenerate(const Args& args);
int RunScore(const Args& args);
int RunTokenize(const Args& args);
int RunBench(const Args& args);
int RunTrace(const Args& args);
int RunPack(const Args& args);
int RunUp(const Args& args);
int RunClient(const Args& args);
int RunLoadgen(const Args& args);

}  // namespace mer::cli
