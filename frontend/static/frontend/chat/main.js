/*
 * Cachet chat UI, the entry module: plain JavaScript ES modules, no framework, no build step.
 * Talks to the server as described in docs/chat-protocol.md (WebSocket /ws/chat/ for turns, JSON
 * endpoints under /chat/api/). chat.html loads the vendored `marked` and `DOMPurify` first.
 *
 * One module per concept, and no cycle among them: `collectstatic` writes each dependency's
 * hashed name into the module that loads it, and the hashes in a cycle never settle
 * (tests/frontend checks both). A lower module that must call up (the socket, the composer) is
 * handed that call here. NOTE: Django finds the statements to rewrite with a regular expression
 * that also starts inside comments, at either keyword that opens such a statement: keep both
 * keywords out of the comments above them (tests/frontend/test_static_modules.py fails if not).
 *
 * Security: answers are markdown rendered with marked, raw HTML in them is shown as text, and the
 * result always goes through DOMPurify before it reaches the DOM; user messages, titles, source
 * fields and errors are set with textContent only.
 *
 * Stable hooks for the browser tests (keep these names):
 *   #message-input                 the composer textarea
 *   #send-button, #stop-button     send (hidden while a turn runs) / stop (shown only then)
 *   #new-chat-button               starts a new chat
 *   #conversation-list             sidebar list: li[data-conversation-id] > a.conversation-link
 *                                  (the current one has class "active"); .rename-button, .delete-button
 *   #messages                      the message list (aria-live="polite")
 *   .message.user                  a user message (plain text in .content)
 *   .message.assistant             an answer; data-message-id once saved
 *     .typing-dots                 present only until the first token
 *     .content                     the rendered, sanitised markdown (a.citation links inside)
 *     .sources a.source-link       the sources list under the answer
 *     .stats                       stats line of a finished answer
 *     .regenerate-button           only on the last answer
 *     .copy-button                 copies the answer's raw markdown (code blocks: .code-copy-button)
 *     .feedback-button             thumbs up / down (data-rating, aria-pressed); .feedback-note
 *     .finish-badge                "stopped" / "length limit" / "interrupted" / "error"
 *     .answer-model                the model that answered (shown with the model picker)
 *     .retry-button                in an error that can be retried
 *   .error-message                 an error shown inline (in a bubble) or as a toast
 *   #connection-status             data-state = connecting | reconnecting | open | closed
 *   #collection-picker             collections for a new chat (shown only for a new chat)
 *   #profile-select                profile for a new chat (shown if there is more than one)
 *   #model-picker, #model-select   the model each turn asks for (shown if there is more than one)
 *   #upload-form, .upload-progress staff upload and its live progress items
 *   #new-collection                staff: a collection made inline (#new-collection-name, -create)
 *   #bulk-upload, .bulk-result     staff: a folder / files / zips at once, a result per file
 *   #ingestion-queue .queue-item   staff: every document's ingestion (.queue-cancel, .queue-retry)
 *   #source-panel                  a clicked citation's document (mark.cited-span), #source-panel-close
 */

import { autosize, setUpComposer, updateComposer } from "./composer.js";
import { config } from "./config.js";
import {
  loadConversations,
  openConversation,
  routeFromLocation,
  setUpConversations,
  startNewChat,
} from "./conversations.js";
import { setUpFeedback } from "./feedback.js";
import { gettext } from "./i18n.js";
import { markdownLoaded } from "./markdown.js";
import { setUpMessageActions } from "./messages.js";
import { loadOptions, setUpOptions } from "./options.js";
import { setUpScrolling } from "./scrolling.js";
import { setUpSidebar } from "./sidebar.js";
import { connect, setStatus } from "./socket.js";
import { setUpSourcePanel } from "./source_panel.js";
import { toast } from "./toasts.js";
import { afterReconnect, interruptTurn, onFrame, regenerate, sendMessage } from "./turns.js";
import { setUpUpload } from "./upload.js";
import { setUpBulkUpload } from "./bulk_upload.js";
import { openQueue, setUpIngestionQueue } from "./ingestion_queue.js";
import { setUpNewCollection } from "./new_collection.js";
import { isNumber } from "./values.js";

function start() {
  setUpScrolling();
  setUpMessageActions({ onRegenerate: regenerate });
  setUpFeedback();
  setUpSourcePanel();
  setUpConversations();
  setUpOptions();
  setUpComposer({ onSend: () => sendMessage() });
  setUpSidebar();
  setUpUpload();
  setUpNewCollection({ onCreated: () => loadOptions(0) });
  setUpBulkUpload({ onSent: openQueue });
  setUpIngestionQueue();

  if (!markdownLoaded()) {
    toast(gettext("The markdown libraries did not load; answers are shown as plain text."));
  }
  setStatus("connecting");
  autosize();
  updateComposer();
  loadOptions(0);
  loadConversations();
  const id = isNumber(config.conversation_id) ? config.conversation_id : routeFromLocation();
  if (id !== null) openConversation(id, { replace: routeFromLocation() !== id });
  else startNewChat({ push: false });
  history.replaceState({ conversation: id }, "", window.location.href);
  connect({
    onOpen(first) {
      updateComposer();
      if (!first) afterReconnect();
    },
    onFrame,
    onDrop() {
      interruptTurn();
      updateComposer();
    },
  });
}

start();
