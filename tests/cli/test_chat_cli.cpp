// `longctx chat` as a user meets it: in a pseudo-terminal (forkpty), typing messages and
// commands, arrow-key history, Ctrl-C during a reply and at the prompt, Ctrl-D; and with piped
// stdin, as scripts use it. Runs the committed needle model (models/needle) on the CPU; every
// wait is for an expected string with a timeout, never a sleep.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "common/test_data.h"

namespace fs = std::filesystem;
using longctx::testing::cli_path;
using longctx::testing::slurp;

namespace {

std::string needle_model() { return longctx::testing::test_data_dir() + "/../../models/needle"; }

constexpr double kTimeoutS = 60;  // generous: CI shares 2 cores with the rest of the suite

// `longctx chat` on a pseudo-terminal: what it writes (stdout and stderr) collects in out(),
// keystrokes go in through type().
class PtyChat {
 public:
  PtyChat(const std::vector<std::string>& args, const fs::path& home) {
    struct winsize ws = {};
    ws.ws_row = 40;
    ws.ws_col = 200;
    pid_ = forkpty(&master_, nullptr, nullptr, &ws);
    if (pid_ == 0) {
      // The child: a clean editline setup (no user ~/.editrc), a terminal type every system has.
      setenv("HOME", home.c_str(), 1);
      unsetenv("EDITRC");
      setenv("TERM", "xterm", 1);
      std::vector<std::string> argv_s = {cli_path(),     "chat",          "--model",
                                         needle_model(), "--temperature", "0"};
      argv_s.insert(argv_s.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~PtyChat() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (master_ >= 0) close(master_);
  }
  bool started() const { return pid_ > 0; }
  const std::string& out() const { return out_; }

  void type(const std::string& keys) {
    ASSERT_EQ(write(master_, keys.data(), keys.size()), static_cast<ssize_t>(keys.size()));
  }
  // Waits until `text` appears after the previous match; true when it did (then the next wait
  // starts after it).
  bool wait_for(const std::string& text, double timeout_s = kTimeoutS) {
    const auto deadline = now() + timeout_s;
    while (true) {
      const size_t at = out_.find(text, from_);
      if (at != std::string::npos) {
        from_ = at + text.size();
        return true;
      }
      if (now() > deadline || !pump(deadline - now())) return false;
    }
  }
  // Waits for whichever of `texts` comes first after the previous match: its index, or -1.
  int wait_for_any(const std::vector<std::string>& texts, double timeout_s = kTimeoutS) {
    const auto deadline = now() + timeout_s;
    while (true) {
      size_t best = std::string::npos;
      int which = -1;
      for (size_t i = 0; i < texts.size(); ++i) {
        const size_t at = out_.find(texts[i], from_);
        if (at < best) {
          best = at;
          which = static_cast<int>(i);
        }
      }
      if (which >= 0) {
        from_ = best + texts[static_cast<size_t>(which)].size();
        return which;
      }
      if (now() > deadline || !pump(deadline - now())) return -1;
    }
  }
  // Waits until at least `n` more bytes arrived after the previous match.
  bool wait_bytes(size_t n, double timeout_s = kTimeoutS) {
    const auto deadline = now() + timeout_s;
    while (out_.size() < from_ + n) {
      if (now() > deadline || !pump(deadline - now())) return false;
    }
    return true;
  }
  // Waits for the program to exit (reading what it still writes); its exit status, -1 when it
  // did not exit in time or was killed by a signal.
  int wait_exit(double timeout_s = kTimeoutS) {
    const auto deadline = now() + timeout_s;
    while (now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        while (pump(0.2)) {
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      pump(0.05);
    }
    return -1;
  }
  // The output since position `pos` (after a previous out().size()).
  std::string since(size_t pos) const { return out_.substr(pos); }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // Reads what is available within `timeout_s`; false on end of output or an error.
  bool pump(double timeout_s) {
    pollfd p{master_, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::max(0.0, timeout_s) * 1000));
    if (r < 0) return errno == EINTR;
    if (r == 0) return true;
    char buf[4096];
    const ssize_t n = read(master_, buf, sizeof(buf));
    if (n <= 0) return false;  // EIO once the child closed the terminal
    out_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int master_ = -1;
  bool exited_ = false;
  std::string out_;
  size_t from_ = 0;
};

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

class ChatCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(cli_path())) << "longctx binary not built at " << cli_path();
    dir_ = fs::temp_directory_path() / ("longctx_chat_cli_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Starts a chat and waits for its first prompt.
  std::unique_ptr<PtyChat> start(const std::vector<std::string>& args) {
    auto chat = std::make_unique<PtyChat>(args, dir_);
    EXPECT_TRUE(chat->started());
    EXPECT_TRUE(chat->wait_for("Ctrl-D quits.")) << chat->out();
    EXPECT_TRUE(chat->wait_for("> ")) << chat->out();
    return chat;
  }
  // /save, then quit with `quit`: the conversation as saved, `n` messages long.
  nlohmann::json save_and_quit(PtyChat& chat, size_t n, const std::string& quit = "/exit\r") {
    const fs::path saved = dir_ / "conv.json";
    chat.type("/save " + saved.string() + "\r");
    EXPECT_TRUE(chat.wait_for("[saved " + std::to_string(n) + " messages")) << chat.out();
    EXPECT_TRUE(chat.wait_for("> ")) << chat.out();
    chat.type(quit);
    EXPECT_EQ(chat.wait_exit(), 0) << chat.out();
    return read_json(saved);
  }
  fs::path dir_;
};

// --summary ends each reply with "[... generated tokens, finish: ...]" before the next prompt.
const std::vector<std::string> kShortReplies = {"--summary", "--ignore-eos", "--max-tokens", "6"};

TEST_F(ChatCli, AnswersAndSavesTheConversation) {
  auto chat = start(kShortReplies);
  chat->type("h\u00e9llo w\u00f6rld\r");  // UTF-8 typed in, whatever the locale
  ASSERT_TRUE(chat->wait_for("6 generated tokens, finish: length")) << chat->out();
  ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
  const auto conv = save_and_quit(*chat, 2);
  ASSERT_EQ(conv.size(), 2u) << conv;
  EXPECT_EQ(conv[0], (nlohmann::json{{"role", "user"}, {"content", "h\u00e9llo w\u00f6rld"}}));
  EXPECT_EQ(conv[1]["role"], "assistant");
  const std::string reply = conv[1]["content"];
  EXPECT_FALSE(reply.empty());
  // The reply shown is the one kept (the terminal turns "\n" into "\r\n").
  std::string shown;
  for (char c : reply) {
    if (c == '\n') shown += '\r';
    shown += c;
  }
  EXPECT_NE(chat->out().find(shown), std::string::npos) << chat->out();
}

TEST_F(ChatCli, CtrlCStopsAReplyAndKeepsTheConversation) {
  // A reply of thousands of tokens: Ctrl-C as soon as it starts must stop it early.
  auto chat =
      start({"--summary", "--ignore-eos", "--max-tokens", "100000", "--max-model-len", "8192"});
  chat->type("tell me a long story\r");
  ASSERT_TRUE(chat->wait_for("tell me a long story")) << chat->out();  // the echo
  // The prefill's progress line is erased before the reply's first text.
  ASSERT_TRUE(chat->wait_for("\r\x1b[K")) << chat->out();
  ASSERT_TRUE(chat->wait_bytes(40)) << chat->out();  // the reply is streaming
  chat->type("\x03");
  ASSERT_TRUE(chat->wait_for("[stopped]")) << chat->out();
  ASSERT_TRUE(chat->wait_for("generated tokens, finish: abort")) << chat->out();
  ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
  const auto conv = save_and_quit(*chat, 2, "\x04");  // Ctrl-D
  ASSERT_EQ(conv.size(), 2u) << conv;
  EXPECT_EQ(conv[0]["content"], "tell me a long story");
  const std::string partial = conv[1]["content"];
  EXPECT_FALSE(partial.empty());
  EXPECT_LT(partial.size(), 4000u) << "the reply was not stopped early";
}

TEST_F(ChatCli, SlashCommandsStayLocal) {
  auto chat = start({"--summary", "--ignore-eos", "--max-tokens", "4", "--system", "be brief"});
  chat->type("/help\r");
  ASSERT_TRUE(chat->wait_for("/save FILE")) << chat->out();
  ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
  size_t mark = chat->out().size();
  chat->type("/bogus thing\r");
  ASSERT_TRUE(chat->wait_for("unknown command /bogus (not sent to the model)")) << chat->out();
  ASSERT_TRUE(chat->wait_for("/clear")) << chat->out();  // the help follows
  ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
  EXPECT_EQ(chat->since(mark).find("generated tokens"), std::string::npos) << chat->out();
  chat->type("hi\r");
  ASSERT_TRUE(chat->wait_for("4 generated tokens")) << chat->out();
  ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
  const fs::path before = dir_ / "before.json", after = dir_ / "after.json";
  chat->type("/save " + before.string() + "\r");
  ASSERT_TRUE(chat->wait_for("[saved 3 messages")) << chat->out();
  chat->type("/clear\r");
  ASSERT_TRUE(chat->wait_for("[conversation cleared]")) << chat->out();
  chat->type("/save " + after.string() + "\r");
  ASSERT_TRUE(chat->wait_for("[saved 1 messages")) << chat->out();
  EXPECT_EQ(read_json(after),
            nlohmann::json::parse(R"([{"role": "system", "content": "be brief"}])"));
  // /load brings the saved conversation back (and rejects a malformed file, keeping the
  // session): after it, /save writes the same messages.
  const fs::path bad = dir_ / "bad.json", again = dir_ / "again.json";
  std::ofstream(bad) << R"([{"role": "user"}])";
  chat->type("/load " + bad.string() + "\r");
  ASSERT_TRUE(chat->wait_for("message 0 is not an object with a string \"role\" and a string"))
      << chat->out();
  chat->type("/load " + before.string() + "\r");
  ASSERT_TRUE(chat->wait_for("[loaded 3 messages")) << chat->out();
  chat->type("/save " + again.string() + "\r");
  ASSERT_TRUE(chat->wait_for("[saved 3 messages")) << chat->out();
  EXPECT_EQ(read_json(again), read_json(before));
  chat->type("/quit\r");
  EXPECT_EQ(chat->wait_exit(), 0) << chat->out();
}

TEST_F(ChatCli, UpArrowRecallsThePreviousLine) {
  auto chat = start(kShortReplies);
  chat->type("first line\r");
  ASSERT_TRUE(chat->wait_for("6 generated tokens")) << chat->out();
  ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
  chat->type("\x1b[A\r");  // Up, Enter: the same message again
  ASSERT_TRUE(chat->wait_for("6 generated tokens")) << chat->out();
  ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
  const auto conv = save_and_quit(*chat, 4);
  ASSERT_EQ(conv.size(), 4u) << conv;
  EXPECT_EQ(conv[2]["content"], "first line");
  EXPECT_FALSE(chat->out().find("^[[A") != std::string::npos) << chat->out();
}

TEST_F(ChatCli, CtrlCTwiceAtAnEmptyPromptQuits) {
  auto chat = start(kShortReplies);
  chat->type("half typed");
  // Ctrl-C flushes the terminal's unread input: wait until the editor has the text.
  ASSERT_TRUE(chat->wait_for("half typed")) << chat->out();
  const size_t mark = chat->out().size();
  chat->type("\x03");  // drops the line, stays
  ASSERT_TRUE(chat->wait_for("^C")) << chat->out();
  ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
  EXPECT_EQ(chat->since(mark).find("Ctrl-C again"), std::string::npos) << chat->out();
  chat->type("\x03");
  ASSERT_TRUE(chat->wait_for("Ctrl-C again or Ctrl-D to quit")) << chat->out();
  ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
  chat->type("\x03");
  EXPECT_EQ(chat->wait_exit(), 0) << chat->out();
  EXPECT_EQ(chat->out().find("generated tokens"), std::string::npos) << chat->out();
}

TEST_F(ChatCli, FullContextAsksAndDropsTheOldestTurns) {
  // 96 tokens of context, 8 kept for each reply: the third long message does not fit.
  auto chat = start({"--summary", "--ignore-eos", "--max-tokens", "8", "--max-model-len", "96"});
  const std::string msg = "the quick brown fox jumps over the lazy dog again";
  // Sends `msg` until the next one does not fit; *turns: how many did.
  const auto fill = [&](int* turns) {
    for (*turns = 0; *turns < 20; ++*turns) {
      chat->type(msg + "\r");
      const int got = chat->wait_for_any({"8 generated tokens", "does not fit the context of 96"});
      ASSERT_GE(got, 0) << chat->out();
      if (got == 1) break;
      ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
    }
    ASSERT_LT(*turns, 20) << chat->out();
  };
  int turns = 0;
  fill(&turns);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_GE(turns, 1) << chat->out();
  // The question's prompt came up: Enter takes the default, dropping the oldest turns.
  ASSERT_TRUE(chat->wait_for("cancel this message (n)? [d] ")) << chat->out();
  chat->type("\r");
  ASSERT_TRUE(chat->wait_for("[dropped the")) << chat->out();
  ASSERT_TRUE(chat->wait_for("8 generated tokens")) << chat->out();
  ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
  // Fill it again: "n" leaves the conversation as it was, "c" clears it and sends the message.
  const fs::path before = dir_ / "before.json", after = dir_ / "after.json";
  for (const std::string answer : {"n", "c"}) {
    fill(&turns);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_TRUE(chat->wait_for("[d] ")) << chat->out();
    if (answer == "n") {
      chat->type("/save " + before.string() + "\r");  // an unknown answer asks again
      ASSERT_TRUE(chat->wait_for("[d] ")) << chat->out();
    }
    chat->type(answer + "\r");
    if (answer == "n") {
      ASSERT_TRUE(chat->wait_for("[not sent; the conversation is unchanged]")) << chat->out();
      ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
      chat->type("/save " + before.string() + "\r");
      ASSERT_TRUE(chat->wait_for("[saved")) << chat->out();
      ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
    } else {
      ASSERT_TRUE(chat->wait_for("[conversation cleared]")) << chat->out();
      ASSERT_TRUE(chat->wait_for("8 generated tokens")) << chat->out();
      ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
      chat->type("/save " + after.string() + "\r");
      ASSERT_TRUE(chat->wait_for("[saved 2 messages")) << chat->out();
      ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
    }
  }
  EXPECT_GE(read_json(before).size(), 2u);
  EXPECT_EQ(read_json(after)[0]["content"], msg);
  chat->type("/exit\r");
  EXPECT_EQ(chat->wait_exit(), 0) << chat->out();
}

TEST_F(ChatCli, PipedInputIsReadLineByLine) {
  const fs::path saved = dir_ / "conv.json", input = dir_ / "in.txt";
  std::ofstream(input) << "hello\\\nthere\n/bogus\n//etc is a folder\n/save " << saved.string()
                       << "\n";
  const auto r = longctx::testing::run_cli("chat --model '" + needle_model() +
                                           "' --temperature 0 --ignore-eos --max-tokens 5 < '" +
                                           input.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.find("> "), std::string::npos) << r.err;  // no prompts without a terminal
  EXPECT_NE(r.err.find("unknown command /bogus"), std::string::npos) << r.err;
  const auto conv = read_json(saved);
  ASSERT_EQ(conv.size(), 4u) << conv;
  EXPECT_EQ(conv[0]["content"], "hello\nthere");  // a backslash continues the line
  EXPECT_EQ(conv[2]["content"], "/etc is a folder");
  // The two replies on stdout, each ended by a newline.
  EXPECT_EQ(r.out, conv[1]["content"].get<std::string>() + "\n" +
                       conv[3]["content"].get<std::string>() + "\n");
}

TEST_F(ChatCli, PromptFileIsTheFirstMessage) {
  // A document, asked about from a file (then the piped lines), or
  // sent whole from standard input (which then ends the chat).
  std::string document;
  while (document.size() < 6'000) document += "the quick brown fox jumps over the lazy dog. ";
  const fs::path doc = dir_ / "doc.txt", saved = dir_ / "conv.json", input = dir_ / "in.txt";
  std::ofstream(doc) << document;
  std::ofstream(input) << "and then?\n/save " << saved.string() << "\n";
  const std::string base = "chat --model '" + needle_model() +
                           "' --temperature 0 --ignore-eos --max-tokens 3 --summary ";
  auto r = longctx::testing::run_cli(base + "--prompt-file '" + doc.string() + "' < '" +
                                     input.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto conv = read_json(saved);
  ASSERT_EQ(conv.size(), 4u) << conv;
  EXPECT_EQ(conv[0]["content"], document);
  EXPECT_EQ(conv[2]["content"], "and then?");
  r = longctx::testing::run_cli(base + "-f - < '" + doc.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"((\d+) prompt \+ 3 generated)"))) << r.err;
  EXPECT_GT(std::stoll(m[1]), 500);  // the whole document (~10 characters a token here)
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1);  // one reply, then the end
  r = longctx::testing::run_cli(base + "-f /dev/null < /dev/null");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--prompt-file /dev/null: the prompt is empty"), std::string::npos) << r.err;
}

TEST_F(ChatCli, PipedFullContextDropsTheOldestTurns) {
  const fs::path saved = dir_ / "conv.json", input = dir_ / "in.txt";
  {
    std::ofstream in(input);
    for (int i = 0; i < 8; ++i) in << "message number " << i << " about the quick brown fox\n";
    in << "/save " << saved.string() << "\n";
  }
  const auto r = longctx::testing::run_cli(
      "chat --model '" + needle_model() +
      "' --temperature 0 --ignore-eos --max-tokens 8 --max-model-len 96 < '" + input.string() +
      "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("(the default without a terminal)"), std::string::npos) << r.err;
  const auto conv = read_json(saved);
  ASSERT_GE(conv.size(), 2u) << conv;
  EXPECT_LT(conv.size(), 16u) << conv;
  EXPECT_EQ(conv[conv.size() - 2]["content"], "message number 7 about the quick brown fox");
}

TEST_F(ChatCli, HistoryFileKeepsLinesAcrossSessions) {
  const std::string history = (dir_ / "history").string();
  std::vector<std::string> args = kShortReplies;
  args.insert(args.end(), {"--history-file", history});
  {
    auto chat = start(args);
    chat->type("from last time\r");
    ASSERT_TRUE(chat->wait_for("6 generated tokens")) << chat->out();
    ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
    chat->type("/exit\r");
    ASSERT_EQ(chat->wait_exit(), 0) << chat->out();
  }
  auto chat = start(args);
  chat->type("\x1b[A\x1b[A\r");  // Up twice (past "/exit"), Enter
  ASSERT_TRUE(chat->wait_for("6 generated tokens")) << chat->out();
  ASSERT_TRUE(chat->wait_for("> ")) << chat->out();
  EXPECT_EQ(save_and_quit(*chat, 2)[0]["content"], "from last time");
}

TEST_F(ChatCli, SystemFileIsTheSystemMessage) {
  const fs::path system = dir_ / "system.txt", saved = dir_ / "conv.json", input = dir_ / "in";
  std::ofstream(system) << "be brief\n";
  std::ofstream(input) << "/save " << saved.string() << "\n";
  const std::string base = "chat --model '" + needle_model() + "' ";
  auto r = longctx::testing::run_cli(base + "--system-file '" + system.string() + "' < '" +
                                     input.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(read_json(saved),
            nlohmann::json::parse(R"([{"role": "system", "content": "be brief"}])"));
  r = longctx::testing::run_cli(base + "--system x --system-file '" + system.string() + "' < '" +
                                input.string() + "'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("excludes"), std::string::npos) << r.err;
  r = longctx::testing::run_cli(base + "--system-file '" + (dir_ / "missing").string() + "' < '" +
                                input.string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("cannot read --system-file"), std::string::npos) << r.err;
}

TEST_F(ChatCli, NoTokenizerOrTemplateIsAClearErrorAtStart) {
  const fs::path input = dir_ / "in", tok = dir_ / "tok";
  std::ofstream(input) << "hello\n";
  auto r = longctx::testing::run_cli("chat --model '" + longctx::testing::test_data_dir() +
                                     "/fixtures/tiny-llama3' < '" + input.string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("chat needs a tokenizer"), std::string::npos) << r.err;
  // A tokenizer folder without tokenizer_config.json: no chat template.
  fs::create_directories(tok);
  fs::copy_file(needle_model() + "/tokenizer.json", tok / "tokenizer.json");
  r = longctx::testing::run_cli("chat --model '" + needle_model() + "' --tokenizer '" +
                                tok.string() + "' < '" + input.string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("chat needs a chat template"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace
