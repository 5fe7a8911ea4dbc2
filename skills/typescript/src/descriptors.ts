/**
 * What a hook or a tool is on the wire: the descriptors a worker group announces in the
 * registry, field for field the Python models (hookbus.skills.descriptors), so the
 * orchestrator plans TypeScript hooks exactly like Python ones.
 */

export interface HookDescriptor {
  skill: string;
  method: string;
  lifecycle: string;
  priority: number;
  scope: string;
  timeout: number | null;
  critical: boolean;
  guard: boolean;
  /** An observer: gets the stage's data after the stage ended, off the request's path. */
  observe: boolean;
  /** on_chunk only: characters of the model's text held back from the client until this
   * hook judged the text after them. */
  hold_back: number;
}

export interface ToolDescriptor {
  skill: string;
  name: string;
  /** The OpenAI function tool: `{type: 'function', function: {name, description, parameters}}`. */
  parameters_schema: Record<string, unknown>;
  scope: string;
  timeout: number | null;
}
