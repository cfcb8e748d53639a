// A non-Python client of the query service: loads proto/ with @grpc/proto-loader,
// calls MapService.Get, BatchGet and a failing Get, and prints one JSON line.
//   node client.js <proto root> <host:port> <map> <key> [bearer token]
'use strict';
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [protoRoot, target, map, key, token] = process.argv.slice(2);
const definition = protoLoader.loadSync(
  ['materializer/v1/map_service.proto', 'materializer/v1/admin_service.proto'],
  { includeDirs: [path.resolve(protoRoot)], keepCase: true, longs: String, defaults: true },
);
const v1 = grpc.loadPackageDefinition(definition).materializer.v1;
const maps = new v1.MapService(target, grpc.credentials.createInsecure());
const admin = new v1.AdminService(target, grpc.credentials.createInsecure());

function call(client, method, request) {
  const metadata = new grpc.Metadata();
  if (token) metadata.add('authorization', `Bearer ${token}`);
  const deadline = new Date(Date.now() + 10000);
  return new Promise((resolve) => {
    client[method](request, metadata, { deadline }, (err, response) => {
      resolve(err ? { error: { code: err.code, details: err.details } } : { response });
    });
  });
}

(async () => {
  const get = await call(maps, 'Get', { map, key });
  const batch = await call(maps, 'BatchGet', { map, keys: [key, 'absent-key'] });
  const unknown = await call(maps, 'Get', { map: 'no-such-map', key });
  const listed = await call(admin, 'ListMaps', {});
  const out = {
    get: {
      found: get.response.found,
      entity: Buffer.from(get.response.entity).toString('utf8'),
      batch_id: get.response.watermark ? get.response.watermark.batch_id : null,
    },
    batch: batch.response.entries.map((e) => [e.key, e.found]),
    unknown_code: unknown.error ? unknown.error.code : null,
    maps: listed.response.maps.map((m) => m.name),
  };
  process.stdout.write(JSON.stringify(out) + '\n');
  maps.close();
  admin.close();
})().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + '\n');
  process.exit(1);
});
