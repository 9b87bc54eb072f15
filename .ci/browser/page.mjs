// The serve example's page in headless Chromium, as a person uses it: type a message and see
// the answer stream in, ask for a gated call, approve it, see the tool log and the answer.
// Usage: node .ci/browser/page.mjs URL SCREENSHOT (CHROMIUM names the browser, /usr/bin/chromium
// by default).
import puppeteer from "puppeteer-core";

const [url, screenshot] = process.argv.slice(2);
const fail = (message) => {
  console.error(`page: FAILED: ${message}`);
  process.exit(1);
};
const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  // CI runs as root, where Chromium's sandbox cannot start.
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1100, height: 620 });
  page.on("pageerror", (error) => fail(`a script error on the page: ${error.message}`));
  await page.goto(url, { waitUntil: "load" });

  // 1. A message: the answer's bubble is seen growing before it is whole.
  await page.type("#input", "hello there");
  await page.click("#send");
  const lengths = [];
  let answer = "";
  const deadline = Date.now() + 20000;
  while (Date.now() < deadline) {
    const text = await page.$$eval(".assistant", (all) => (all.length ? all[all.length - 1].textContent : ""));
    if (text.length && lengths[lengths.length - 1] !== text.length) lengths.push(text.length);
    if (text.endsWith("write a note.")) {
      answer = text;
      break;
    }
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  if (!answer) fail(`no answer came (lengths seen: ${lengths})`);
  if (lengths.length < 3) fail(`the answer did not stream: it came in ${lengths.length} piece(s)`);
  console.log(`page: the answer streamed in, seen at ${lengths.length} lengths up to ${answer.length} characters`);

  // 2. A gated call waits for a person: nothing runs until the approval.
  await page.type("#input", "write a note");
  await page.click("#send");
  await page.waitForSelector(".approval .approve", { timeout: 20000 });
  const card = await page.$eval(".approval", (element) => element.textContent);
  if (!card.includes("write_file") || !card.includes("note.txt")) fail(`the approval card: ${card}`);
  const early = await page.$$eval("#tools li", (items) => items.map((item) => item.textContent));
  if (!early.includes("write_file ⏸")) fail(`the tool log does not show write_file waiting: ${early}`);
  console.log(`page: the approval card asks to run write_file; the tool log reads ${JSON.stringify(early)}`);

  // 3. Approved: the tool log shows it done, and the answer follows.
  await page.click(".approval .approve");
  await page.waitForFunction(
    () => [...document.querySelectorAll("#tools li")].some((item) => item.textContent === "write_file ✓"),
    { timeout: 20000 },
  );
  await page.waitForFunction(
    () => [...document.querySelectorAll(".assistant")].some((bubble) => bubble.textContent.startsWith("Done: wrote") && bubble.textContent.endsWith("note.txt")),
    { timeout: 20000 },
  );
  const tools = await page.$$eval("#tools li", (items) => items.map((item) => item.textContent));
  console.log(`page: approved; the tool log reads ${JSON.stringify(tools)}, and the answer came`);
  await page.screenshot({ path: screenshot });
} finally {
  await browser.close();
}
