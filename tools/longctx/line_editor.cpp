#include "line_editor.h"

#include <histedit.h>
#include <langinfo.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <clocale>
#include <cstdio>
#include <cstring>
#include <cwchar>
#include <iostream>

#include "longctx/core/error.h"

namespace longctx::cli {

namespace {

constexpr int kHistorySize = 1000;
constexpr int kPollMs = 50;

}  // namespace

struct LineEditor::Impl {
  EditLine* el = nullptr;
  History* hist = nullptr;
  std::string prompt;
  std::string history_file;
  const std::atomic<bool>* interrupt = nullptr;

  static Impl& of(EditLine* el) {
    void* data = nullptr;
    el_get(el, EL_CLIENTDATA, &data);
    return *static_cast<Impl*>(data);
  }
  static const char* prompt_fn(EditLine* el) { return of(el).prompt.c_str(); }

  // libedit's character source. A blocking read() would only see Ctrl-C if the SIGINT landed
  // on this thread, but the process has the engine's worker threads too and the kernel may pick
  // any of them; so the terminal is polled and the caller's flag checked every kPollMs. Returns
  // 1 with a character, 0 at end of input, -1 with errno EINTR when interrupted.
  static int read_char(EditLine* el, wchar_t* out) {
    const std::atomic<bool>* interrupt = of(el).interrupt;
    char bytes[MB_LEN_MAX];
    size_t n = 0;
    while (true) {
      if (interrupt != nullptr && interrupt->load(std::memory_order_relaxed)) {
        errno = EINTR;
        return -1;
      }
      pollfd p{STDIN_FILENO, POLLIN, 0};
      const int ready = poll(&p, 1, kPollMs);
      if (ready < 0 && errno != EINTR) return -1;
      if (ready <= 0) continue;
      const ssize_t got = ::read(STDIN_FILENO, bytes + n, 1);
      if (got < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return -1;
      }
      if (got == 0) return 0;
      ++n;
      std::mbstate_t state{};
      const size_t r = std::mbrtowc(out, bytes, n, &state);
      if (r == static_cast<size_t>(-2) && n < MB_LEN_MAX) continue;  // more bytes to come
      if (r == static_cast<size_t>(-1) || r == static_cast<size_t>(-2)) {
        n = 0;  // not a character in this encoding: drop it, as libedit's own reader does
        continue;
      }
      return 1;
    }
  }
};

LineEditor::LineEditor(const std::string& program, const std::string& history_file,
                       const std::atomic<bool>* interrupt)
    : impl_(std::make_unique<Impl>()) {
  impl_->interrupt = interrupt;
  interactive_ = isatty(STDIN_FILENO) != 0 && isatty(STDERR_FILENO) != 0;
  if (!interactive_) return;
  // libedit decodes input with the locale's multibyte conversion: without a UTF-8 LC_CTYPE it
  // would drop every non-ASCII byte the user types.
  std::setlocale(LC_CTYPE, "");
  if (std::strcmp(nl_langinfo(CODESET), "UTF-8") != 0) std::setlocale(LC_CTYPE, "C.UTF-8");
  impl_->el = el_init(program.c_str(), stdin, stderr, stderr);
  LONGCTX_CHECK(impl_->el != nullptr, ErrorCode::kInternal, "could not set up line editing");
  impl_->hist = history_init();
  LONGCTX_CHECK(impl_->hist != nullptr, ErrorCode::kInternal, "could not set up the history");
  HistEvent ev;
  history(impl_->hist, &ev, H_SETSIZE, kHistorySize);
  history(impl_->hist, &ev, H_SETUNIQUE, 1);
  impl_->history_file = history_file;
  if (!history_file.empty()) history(impl_->hist, &ev, H_LOAD, history_file.c_str());
  el_set(impl_->el, EL_CLIENTDATA, impl_.get());
  el_set(impl_->el, EL_PROMPT, &Impl::prompt_fn);
  el_set(impl_->el, EL_GETCFN, &Impl::read_char);
  el_set(impl_->el, EL_EDITOR, "emacs");
  el_set(impl_->el, EL_HIST, history, impl_->hist);
  // Ctrl-R searches the history backwards, as in readline.
  el_set(impl_->el, EL_BIND, "^R", "em-inc-search-prev", nullptr);
  el_source(impl_->el, nullptr);  // ~/.editrc (or $EDITRC), as every libedit program
}

LineEditor::~LineEditor() {
  if (impl_->hist != nullptr) {
    HistEvent ev;
    if (!impl_->history_file.empty() &&
        history(impl_->hist, &ev, H_SAVE, impl_->history_file.c_str()) < 0) {
      std::fprintf(stderr, "could not write the history file '%s'\n", impl_->history_file.c_str());
    }
    history_end(impl_->hist);
  }
  if (impl_->el != nullptr) el_end(impl_->el);
}

LineEditor::Result LineEditor::read(const std::string& prompt) {
  Result r;
  if (!interactive_) {
    if (std::getline(std::cin, r.line)) {
      if (!r.line.empty() && r.line.back() == '\r') r.line.pop_back();
      r.status = Status::kLine;
    }
    return r;
  }
  impl_->prompt = prompt;
  // The terminal in editing mode before the prompt shows: otherwise el_gets may print the
  // prompt first, and what is typed in between is echoed by the terminal and then again.
  el_set(impl_->el, EL_PREP_TERM, 1);
  int count = 0;
  const char* line = el_gets(impl_->el, &count);
  if (line == nullptr) {
    if (count < 0 &&
        (errno == EINTR || (impl_->interrupt != nullptr && impl_->interrupt->load()))) {
      const LineInfo* info = el_line(impl_->el);
      r.status = Status::kInterrupted;
      r.interrupted_empty = info->lastchar == info->buffer;
    }
    return r;  // kEof: Ctrl-D on an empty line, or the terminal went away
  }
  r.status = Status::kLine;
  r.line = line;  // (count is in characters for some libedit versions, bytes for others)
  while (!r.line.empty() && (r.line.back() == '\n' || r.line.back() == '\r')) r.line.pop_back();
  return r;
}

void LineEditor::add_history(const std::string& line) {
  if (impl_->hist == nullptr || line.empty()) return;
  HistEvent ev;
  history(impl_->hist, &ev, H_ENTER, line.c_str());
}

}  // namespace longctx::cli
