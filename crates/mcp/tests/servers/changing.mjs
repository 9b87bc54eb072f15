// An MCP server on the official TypeScript SDK (the one server-everything is built on) whose
// tool list changes: each call of `add-tool` registers a new tool, and the SDK sends
// `notifications/tools/list_changed`. Run with the SDK's directory as the first argument:
//   node changing.mjs .ci/mcp/node_modules/@modelcontextprotocol/sdk/dist/esm
import path from "node:path";
import { pathToFileURL } from "node:url";

const sdk = process.argv[2];
const { McpServer } = await import(pathToFileURL(path.join(sdk, "server/mcp.js")).href);
const { StdioServerTransport } = await import(pathToFileURL(path.join(sdk, "server/stdio.js")).href);

const server = new McpServer({ name: "changing", version: "1.0.0" });
let added = 0;
server.registerTool("add-tool", { description: "Adds a tool." }, async () => {
    added += 1;
    const name = `added-${added}`;
    server.registerTool(name, { description: `Tool number ${added}.` }, async () => ({
        content: [{ type: "text", text: `this is ${name}` }],
    }));
    return { content: [{ type: "text", text: `added ${name}` }] };
});
await server.connect(new StdioServerTransport());
