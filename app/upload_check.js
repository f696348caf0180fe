// Files larger than --max-upload are refused in the page, before a byte is sent: the status line says which
// and by how much, in binary units (Gradio's own check shows a bare "Error" and "256.0 Mb").
(() => {
  const limit = MAX_UPLOAD_BYTES;
  const mib = (n) => (n / 1048576).toLocaleString("en-US", { maximumFractionDigits: 1 }) + " MiB";
  const refuse = (files) => {
    const big = Array.from(files || []).filter((file) => file.size > limit);
    if (!big.length) return false;
    const text = big.map((file) => `${file.name} is ${mib(file.size)}`).join("; ") +
      `, larger than the ${mib(limit)} this app accepts (--max-upload). Nothing was uploaded.`;
    const line = document.querySelector("#status .status");
    if (line) {
      line.className = "status status-error";
      line.dataset.kind = "error";
      line.textContent = text;
    }
    return true;
  };
  const inDrop = (target) => target instanceof Element && target.closest("#file-drop");
  document.addEventListener("change", (event) => {
    const input = event.target;
    if (!(input instanceof HTMLInputElement) || input.type !== "file" || !inDrop(input)) return;
    if (refuse(input.files)) {
      event.stopImmediatePropagation();
      input.value = "";
    }
  }, true);
  document.addEventListener("drop", (event) => {
    if (inDrop(event.target) && event.dataTransfer && refuse(event.dataTransfer.files)) {
      event.stopImmediatePropagation();
      event.preventDefault();
    }
  }, true);
})();
