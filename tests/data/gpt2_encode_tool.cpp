// Test-only: GPT-2 prompt encoding (plugins/token_shards/gpt2_vocab.cpp) driven from Python, many
// strings through one process.
//
//   gpt2_encode_tool TOKENIZER_DIR [VOCAB_SIZE]  < records
//
// Reads records from stdin, each a 4-byte little-endian length and then that many bytes of text
// (any bytes: malformed UTF-8 included), and writes one line per record: the nanoseconds the
// encoding took, then the ids, separated by spaces. Exit 2 with the message on an input error
// (a malformed tokenizer directory), 1 on anything else.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "ablate/error.hpp"
#include "gpt2_vocab.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: gpt2_encode_tool TOKENIZER_DIR [VOCAB_SIZE] < length-prefixed records\n";
    return 2;
  }
  try {
    const int32_t vocab_size = argc == 3 ? int32_t(std::strtol(argv[2], nullptr, 10)) : 50257;
    const auto vocab = ablate::token_shards::Gpt2Vocab::load(argv[1], vocab_size);
    if (!vocab.can_encode()) ablate::throw_input_error(vocab.file().string(), "does not give every byte a token");
    std::string text, line;
    for (;;) {
      unsigned char size[4];
      const std::size_t got = std::fread(size, 1, 4, stdin);
      if (got == 0) break;
      if (got != 4) ablate::throw_input_error("stdin", "a record's length is cut short");
      const uint32_t n = uint32_t(size[0]) | uint32_t(size[1]) << 8 | uint32_t(size[2]) << 16 | uint32_t(size[3]) << 24;
      text.resize(n);
      if (n > 0 && std::fread(text.data(), 1, n, stdin) != n) ablate::throw_input_error("stdin", "a record is cut short");
      const auto start = std::chrono::steady_clock::now();
      const std::vector<int32_t> ids = vocab.encode(text);
      const auto took = std::chrono::steady_clock::now() - start;
      line = std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count());
      for (int32_t id : ids) line += ' ' + std::to_string(id);
      line += '\n';
      std::fwrite(line.data(), 1, line.size(), stdout);
    }
    std::fflush(stdout);
  } catch (const ablate::Error& e) {
    std::cerr << "gpt2_encode_tool: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "gpt2_encode_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
