/* Search on the site opened from disk (file://).
 *
 * Browsers start no Web Worker from a file, and the theme's search runs in one. Opened
 * from disk, this runs the search worker's script in a hidden frame of the page instead,
 * with the globals it uses (postMessage, addEventListener); the search index comes from
 * search/search_index.js, which the offline plugin writes (mkdocs.yml). Served over
 * http(s), the browser's own Worker is used and this does nothing.
 *
 * The offline plugin adds a shim of its own, fetched from the network, unless the site
 * lists one whose name holds "iframe-worker": this file is that one, so nothing is fetched.
 */
(function () {
  "use strict";
  if (window.location.protocol !== "file:") {
    return;
  }

  function FrameWorker(url) {
    var worker = this;
    this.onmessage = null;
    this.onerror = null;
    this.listeners = { message: [], error: [] };
    this.pending = [];   // messages posted before the script has loaded
    this.scope = null;   // the frame's window, once the script has loaded
    var frame = document.createElement("iframe");
    frame.hidden = true;
    frame.setAttribute("aria-hidden", "true");
    (document.body || document.documentElement).appendChild(frame);
    var scope = frame.contentWindow;
    scope.postMessage = function (data) {  // the worker's answer goes to the page, later, as a worker's would
      setTimeout(function () { worker.emit("message", { data: data }); }, 0);
    };
    scope.importScripts = function () {
      throw new Error("importScripts: not available to the search of a site opened from disk");
    };
    var script = scope.document.createElement("script");
    script.src = new URL(url, document.baseURI).href;
    script.onload = function () {
      worker.scope = scope;
      worker.pending.splice(0).forEach(function (data) { worker.deliver(data); });
    };
    script.onerror = function () {
      worker.emit("error", { message: "cannot load " + script.src });
    };
    scope.document.head.appendChild(script);
  }

  FrameWorker.prototype.deliver = function (data) {
    this.scope.dispatchEvent(new this.scope.MessageEvent("message", { data: data }));
  };

  FrameWorker.prototype.postMessage = function (data) {
    if (this.scope) {
      this.deliver(data);
    } else {
      this.pending.push(data);
    }
  };

  FrameWorker.prototype.emit = function (type, event) {
    var handler = type === "message" ? this.onmessage : this.onerror;
    if (typeof handler === "function") {
      handler.call(this, event);
    }
    (this.listeners[type] || []).slice().forEach(function (fn) { fn(event); });
  };

  FrameWorker.prototype.addEventListener = function (type, fn) {
    (this.listeners[type] = this.listeners[type] || []).push(fn);
  };

  FrameWorker.prototype.removeEventListener = function (type, fn) {
    this.listeners[type] = (this.listeners[type] || []).filter(function (f) { return f !== fn; });
  };

  FrameWorker.prototype.terminate = function () {
    this.pending = [];
    this.scope = null;
  };

  window.Worker = FrameWorker;
})();
