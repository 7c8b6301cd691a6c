// The chat page's bytes: chat_page.html, turned into a string literal at build time
// (CMakeLists.txt writes chat_page_html.inc), so the binary serves it with no file beside it.
#include <string_view>

#include "server/api_server.h"

namespace longctx::server {

std::string_view chat_page_html() {
  static constexpr std::string_view kPage =
#include "chat_page_html.inc"
      ;
  return kPage;
}

}  // namespace longctx::server
