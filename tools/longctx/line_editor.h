// Reads the chat's input lines: on a terminal through libedit (line editing, up/down history,
// ~/.editrc, an optional history file), otherwise plain lines from stdin so that piped input
// keeps working. SIGINT handling is the caller's: its handler sets a flag, and a read while the
// flag is set (or becomes set) returns kInterrupted.
#pragma once

#include <atomic>
#include <memory>
#include <string>

namespace longctx::cli {

class LineEditor {
 public:
  enum class Status {
    kLine,         // a line was read (without its newline)
    kInterrupted,  // a signal (Ctrl-C) interrupted the read; the partly typed line is dropped
    kEof,          // end of input (Ctrl-D on an empty line)
  };
  struct Result {
    Status status = Status::kEof;
    std::string line;
    bool interrupted_empty = false;  // kInterrupted with nothing typed on the line
  };

  // `program` names the editrc section ("longctx"); `history_file` (may be empty) is loaded now
  // and written back by the destructor; `interrupt` (may be null) is the caller's SIGINT flag.
  // Throws Error when the terminal cannot be set up.
  LineEditor(const std::string& program, const std::string& history_file,
             const std::atomic<bool>* interrupt);
  ~LineEditor();
  LineEditor(const LineEditor&) = delete;
  LineEditor& operator=(const LineEditor&) = delete;

  // Whether stdin and stderr are terminals (then lines are edited, prompts shown on stderr).
  bool interactive() const { return interactive_; }
  Result read(const std::string& prompt);
  // Appends a line to the history (interactive only; consecutive duplicates are kept once).
  void add_history(const std::string& line);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool interactive_ = false;
};

}  // namespace longctx::cli
